/*
 * background.pml: what happens to the key besides requests.
 *
 * Clock: the database clock and the database's own decisions. A lease
 * expires (locked_until <= NOW()) at any moment once its attempt no longer
 * runs, and at most SLOW times under an attempt that still runs (a slow
 * handler, a pause). A final record's retention passes (RENEW times): the
 * key's next retention period begins. Both count in the budget FT. A COMMIT whose reply was lost ends,
 * committed or rolled back. A marker whose owner died expires; Redis loses
 * its data.
 *
 * Time is abstract: the protocol never compares clocks, it only reads the
 * flags the database computes at each statement (lease_expired, expired),
 * and both only ever turn from false to true until a write renews the row.
 * A nondeterministic, monotone flip is therefore every clock rate at once.
 */

#ifdef ENV_NO_EXPIRY
/* not the code: a database clock that never expires the lease of an
 * attempt that died, to show that the liveness check can fail */
#define DEAD_EXPIRES(x) (false)
#else
#define DEAD_EXPIRES(x) (!LIVE(x))
#endif
inline expireLease(r) {
	atomic {
		row[r].st == PROC && !row[r].lexp && (DEAD_EXPIRES(row[r].own) || (slow > 0 && ft > 0)) ->
		if
		:: !DEAD_EXPIRES(row[r].own) -> slow--; ft--
		:: else
		fi;
		row[r].lexp = 1;
		exeExp[0] = exeExp[0] || (exe[0] != 0 && cur[0] == row[r].own);
		exeExp[1] = exeExp[1] || (exe[1] != 0 && cur[1] == row[r].own);
		exeExp[2] = exeExp[2] || (exe[2] != 0 && cur[2] == row[r].own)
	}
}

inline passRetention(r) {
	atomic {
		renew > 0 && ft > 0 && FINAL(row[r].st) && !row[r].rexp ->
		renew--; ft--; row[r].rexp = 1; epoch++;
		/* cache entries die before their record (their TTL is taken from
		 * expires_at); with STALE one may outlive it */
#ifdef STALE
		if
		:: true
		:: lcSt = NONE; lcFp = 0; lcSnap = 0; lcEp = 0
		fi;
#ifdef SHARED
		if
		:: true
		:: shSt = NONE; shFp = 0; shSnap = 0; shEp = 0
		fi
#endif
#else
		lcSt = NONE; lcFp = 0; lcSnap = 0; lcEp = 0;
#ifdef SHARED
		shSt = NONE; shFp = 0; shSnap = 0; shEp = 0
#endif
#endif
	}
}

proctype Clock() {
	byte i;
end:
	do
	:: expireLease(0)
#if NROWS > 1
	:: expireLease(1)
#endif
	:: passRetention(0)
#if NROWS > 1
	:: passRetention(1)
#endif
	/* a COMMIT in limbo ends (resolveCommit's "the server may still be committing") */
	:: atomic {
		lbId != 0 ->
		if
		:: commitTx(LIMBO, lbId, lbEp, lbFp)
		:: rollbackTx(LIMBO)
		fi;
		lbId = 0; lbEp = 0; lbFp = 0; i = 0
	   }
#ifdef MARKERS
	/* an in-flight marker expires after the lease */
	:: atomic {
		mkOwn != 0 && (!LIVE(mkOwn) || (slow > 0 && ft > 0)) ->
		if
		:: LIVE(mkOwn) -> slow--; ft--
		:: else
		fi;
		mkOwn = 0; mkFp = 0
	   }
#endif
#ifdef SHARED
	/* Redis restarts empty */
	:: atomic {
		rflush > 0 -> rflush--;
		shSt = NONE; shFp = 0; shSnap = 0; shEp = 0;
#ifdef MARKERS
		mkOwn = 0; mkFp = 0
#endif
	   }
#endif
	od
}

/* Reconciler.RunOnce: settles PROCESSING records whose lease expired. The
 * RecoverFunc looks for the order of the record's period (the example's:
 * a purchase_order row of the key created at or after the record's
 * created_at); Finish or Release are fenced by the lease it read. */
proctype Reconciler() {
	byte i, v, e, sn, res;
end:
	do
	/* ExpiredLeases */
	:: atomic { row[0].st == PROC && row[0].lexp -> rcOwn = row[0].own; v = row[0].ver; e = row[0].ep }
	   goto settle
#if NROWS > 1
	:: atomic { row[1].st == PROC && row[1].lexp -> rcOwn = row[1].own; v = row[1].ver; e = row[1].ep }
	   goto settle
#endif
	od;
settle:
	/* RecoverFunc, then Finish or Release: one step, since an order that
	 * commits between the two leaves the record final and either fails */
	atomic {
		FREE(0);
		sn = ord[e];
		if
		:: sn != 0 -> finishDo(rcOwn, v, DONE, sn)
		:: else -> releaseDo(rcOwn, v)
		fi;
		rcOwn = 0; v = 0; e = 0; sn = 0; res = 0; i = 0
	}
	goto end
}

/* Purge: deletes final records past their retention; never a PROCESSING one. */
proctype Purger() {
end:
	do
	:: atomic { FINAL(row[0].st) && row[0].rexp && row[0].lock == 0 -> clearRow(0) }
#if NROWS > 1
	:: atomic { FINAL(row[1].st) && row[1].rexp && row[1].lock == 0 -> clearRow(1) }
#endif
	od
}
