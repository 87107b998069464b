/*
 * store.pml: the idempotency_record table and the Store's statements
 * (sqlstore.go, store_mysql.go; postgres/postgres.go and sqlite/sqlite.go
 * have the same WHERE clauses).
 *
 * One key. Each statement is one atomic step, as the database makes it: a
 * fenced UPDATE or DELETE reads the latest committed row under its lock. A
 * statement that meets a row another transaction holds (an uncommitted
 * FinishTx) waits for it, and an INSERT that meets an uncommitted INSERT of
 * the key (single-phase's record) waits for it: the Promela guard at the
 * head of each atomic block is that wait. Reads (Lookup, ExpiredLeases)
 * see committed rows only and never wait.
 *
 * The inlines use the calling Client's locals: c (client), me (the
 * attempt's owner id), fp, res, i.
 */

#define NONE 0   /* no row */
#define PROC 1   /* PROCESSING */
#define DONE 2
#define FAIL 3   /* FAILED: a stored rejection */
#define FINAL(s) ((s) == DONE || (s) == FAIL)

/* statement results */
#define OK 0
#define TAKEN 1      /* ErrKeyClaimed */
#define LOST 2       /* ErrLeaseLost: the fenced statement matched no row */
#define ERR 3        /* a store error: the reply was lost, the statement may have landed */
#define NOTFOUND 4   /* ErrRecordNotFound */
#define ROLLEDBACK 5 /* the database rolled the transaction back (deadlock, certification conflict) */

#ifdef MUTANT_NO_UNIQUE_INDEX
#define NROWS 2      /* without UNIQUE (scope, key) a second claim adds a second row */
#else
#define NROWS 1
#endif

typedef Row {
	byte st;    /* status as committed; NONE: no row */
	byte fp;    /* request_fingerprint */
	byte own;   /* locked_by */
	byte ver;   /* lease_version */
	byte snap;  /* the response snapshot: the id of the attempt whose handler produced it */
	bit  lexp;  /* locked_until <= NOW(): set by the database clock (Clock) */
	bit  rexp;  /* expires_at <= NOW() for a final row: retention passed */
	byte ep;    /* ghost: the retention period this row belongs to */
	byte lock;  /* the attempt whose open transaction wrote this row and holds it */
	byte pst; byte pfp; byte psnap; byte pver; /* that transaction's uncommitted write */
}
Row row[NROWS];

/* A row another transaction holds makes a writer wait (uncommitted inserts
 * are waited for by INSERTs only: see NOPEND). */
#define HELD(r, x) (row[r].st != NONE && row[r].lock != 0 && row[r].lock != (x))
#define NOPENDI(r, x) (!(row[r].st == NONE && row[r].lock != 0 && row[r].lock != (x)))
#if NROWS == 1
#define EXPIRED (row[0].lexp)
#define FREE(x) (!HELD(0, x))
#define NOPEND(x) (NOPENDI(0, x))
#define EXISTS (row[0].st != NONE)
#else
#define EXPIRED (row[0].lexp || row[1].lexp)
#define FREE(x) (!HELD(0, x) && !HELD(1, x))
#define NOPEND(x) (NOPENDI(0, x) && NOPENDI(1, x))
#define EXISTS (row[0].st != NONE || row[1].st != NONE)
#endif

inline clearRow(r) {
	row[r].st = NONE; row[r].fp = 0; row[r].own = 0; row[r].ver = 0; row[r].snap = 0;
	row[r].lexp = 0; row[r].rexp = 0; row[r].ep = 0
}

inline setRow(r, s, f, o, v, sn) {
	row[r].st = s; row[r].fp = f; row[r].own = o; row[r].ver = v; row[r].snap = sn;
	row[r].lexp = 0; row[r].rexp = 0; row[r].ep = epoch
}

/* findRow sets i to the first row satisfying cond (an expression in i), or
 * to NROWS if none does. */
inline findRow(cond) {
	i = 0;
	do
	:: i < NROWS && !(cond) -> i++
	:: else -> break
	od
}

/* every statement ends with i = 0, so that the index does not tell states apart */

/* the row a new INSERT goes to: with the unique index there is one */
inline freeSlot() {
	findRow(row[i].st == NONE && row[i].lock == 0)
}

/*
 * Lookup: a fresh SELECT by (scope, key) outside any transaction; the
 * database computes lease_expired and expired. lookup() in idempotency.go
 * also caches a final record that has not expired, in this process and in
 * the SharedCache: that is done in the same step (the TTL is taken from
 * the database's clock at the read; see README, "left out").
 * The read lands in the Client's r* locals; on NOTFOUND they keep the
 * previous read.
 */
#ifdef MUTANT_REPLAY_BEFORE_COMMIT
/* the mutant reads uncommitted writes (a dirty read): a FinishTx or an
 * InsertFinal not yet committed looks final */
#define VIS(r) (row[r].st != NONE || row[r].pst != NONE)
#else
#define VIS(r) (row[r].st != NONE)
#endif

inline readRow(r) {
	rSt = row[r].st; rFp = row[r].fp; rOwn = row[r].own; rVer = row[r].ver;
	rSnap = row[r].snap; rLexp = row[r].lexp; rRexp = row[r].rexp; rEp = row[r].ep;
#ifdef MUTANT_REPLAY_BEFORE_COMMIT
	if
	:: row[r].pst != NONE ->
		if
		:: row[r].st == NONE -> rFp = row[r].pfp; rOwn = row[r].lock; rEp = epoch
		:: else
		fi;
		rSt = row[r].pst; rSnap = row[r].psnap; rVer = row[r].pver; rLexp = 0; rRexp = 0
	:: else
	fi;
#endif
	rOk = S3OK(rEp);
	MIRROR
}

inline lookup() {
	atomic {
		if
		:: VIS(0) -> readRow(0); res = OK
#if NROWS > 1
		:: VIS(1) -> readRow(1); res = OK
#endif
		:: else -> res = NOTFOUND
		fi;
		if
		:: res == OK && FINAL(rSt) && !rRexp ->
			cachePut(rSt, rFp, rSnap, rEp)
		:: else
		fi
	}
}

/* Claim: INSERT ... 'PROCESSING', lease_version 1, in autocommit. */
inline claimStmt() {
	atomic {
		NOPEND(me);
		if
		:: TAKE(faults); res = ERR;  /* mayHaveLanded: the INSERT may have happened */
			freeSlot();
			if
#ifdef MUTANT_NO_UNIQUE_INDEX
			:: i < NROWS -> setRow(i, PROC, fp, me, 1, 0)
#else
			:: i < NROWS && !EXISTS -> setRow(i, PROC, fp, me, 1, 0)
#endif
			:: true
			fi
		:: true ->
			freeSlot();
			if
#ifdef MUTANT_NO_UNIQUE_INDEX
			:: i < NROWS -> setRow(i, PROC, fp, me, 1, 0); hep = epoch; exe[c] = GRANTED; exeExp[c] = 0; res = OK
#else
			:: i < NROWS && !EXISTS -> setRow(i, PROC, fp, me, 1, 0); hep = epoch; exe[c] = GRANTED; exeExp[c] = 0; res = OK
#endif
			:: else -> res = TAKEN
			fi
		fi
		;i = 0
	}
}

/* A statement whose reply is lost (faults): it landed or it did not. */
#define LANDED_OR_NOT(stmt) \
		if \
		:: TAKE(faults); if :: stmt :: true fi; res = ERR \
		:: true -> stmt \
		fi

/* TakeOver: UPDATE ... WHERE locked_by = ? AND lease_version = ? AND
 * (PROCESSING: locked_until, else expires_at) <= NOW(). A final row taken
 * over starts a new record (created_at restarts): its retention period is
 * the current one. Sets hep, the period of the record the attempt holds. */
#ifdef MUTANT_TAKEOVER_UNEXPIRED
#define TAKEABLE(r) (true)
#else
#define TAKEABLE(r) ((row[r].st == PROC && row[r].lexp) || (FINAL(row[r].st) && row[r].rexp))
#endif
inline takeOverDo(o, v) {
	findRow(row[i].st != NONE && row[i].own == o && row[i].ver == v && TAKEABLE(i));
	if
	:: i < NROWS ->
		if
		:: FINAL(row[i].st) -> row[i].ep = epoch
		:: else
		fi;
		row[i].st = PROC; row[i].fp = fp; row[i].own = me; row[i].ver = v + 1; row[i].snap = 0;
		row[i].lexp = 0; row[i].rexp = 0; hep = row[i].ep; exe[c] = GRANTED; exeExp[c] = 0; res = OK
	:: else -> res = LOST
	fi
}
inline takeOverStmt(o, v) {
	atomic {
		FREE(me);
		takeOverDo(o, v)
		;i = 0
	}
}

/* Extend: UPDATE ... lease_version + 1 WHERE locked_by AND lease_version
 * AND status = 'PROCESSING'. */
inline extendDo(o, v) {
	findRow(row[i].st == PROC && row[i].own == o && row[i].ver == v);
	if
	:: i < NROWS -> row[i].ver = v + 1; row[i].lexp = 0; exeExp[c] = 0;
		if :: exe[c] == 0 -> exe[c] = GRANTED :: else fi;
		res = OK
	:: else -> res = LOST
	fi
}
inline extendStmt(o, v) {
	atomic {
		FREE(me);
		extendDo(o, v)
		;i = 0
	}
}

/* Finish in autocommit (a stored rejection; the reconciler's recovery). */
inline finishDo(o, v, s, sn) {
	findRow(row[i].st == PROC && row[i].own == o && row[i].ver == v);
	if
	:: i < NROWS -> row[i].st = s; row[i].snap = sn; row[i].ver = v + 1; row[i].lexp = 0; res = OK
	:: else -> res = LOST
	fi
}

/* Release: DELETE ... WHERE locked_by AND lease_version AND status = 'PROCESSING'. */
inline releaseDo(o, v) {
	findRow(row[i].st == PROC && row[i].own == o && row[i].ver == v);
	if
	:: i < NROWS -> clearRow(i); res = OK
	:: else -> res = LOST
	fi
}
inline releaseStmt(o, v) {
	atomic {
		FREE(me);
		releaseDo(o, v)
		;i = 0
	}
}

/* FinishTx: Finish inside the business transaction. The row stays held by
 * the transaction until COMMIT or rollback. A failed statement changes
 * nothing (the transaction is rolled back after it). */
#ifdef MUTANT_UNFENCED_FINISH
#define FINISHABLE(r) (row[r].st == PROC)
#else
#define FINISHABLE(r) (row[r].st == PROC && row[r].own == me && row[r].ver == lver)
#endif
inline finishTxStmt() {
	atomic {
		FREE(me);
		if
		:: TAKE(faults); res = ERR
		:: true ->
			findRow(FINISHABLE(i));
			if
			:: i < NROWS ->
				row[i].lock = me; row[i].pst = DONE; row[i].psnap = me; row[i].pver = row[i].ver + 1;
				res = OK
			:: else -> res = LOST
			fi
		fi
		;i = 0
	}
}

/* InsertFinal inside the business transaction (single-phase): the row is
 * written but not committed; another INSERT of the key waits for it. Any
 * committed row of the key makes it fail with a duplicate key, even one
 * past its retention. A deadlock or certification conflict (faults) rolls
 * the transaction back. */
inline insertFinalTxStmt() {
	atomic {
		NOPEND(me);
		if
		:: TAKE(faults); res = ROLLEDBACK
		:: true ->
			freeSlot();
			if
#ifdef MUTANT_NO_UNIQUE_INDEX
			:: i < NROWS ->
#else
			:: i < NROWS && !EXISTS ->
#endif
				row[i].lock = me; row[i].pst = DONE; row[i].pfp = fp; row[i].psnap = me; row[i].pver = 1;
				res = OK
			:: else -> res = TAKEN
			fi
		fi
		;i = 0
	}
}

/* InsertFinal in autocommit: single-phase's stored rejection. */
inline insertFailedDo() {
	freeSlot();
	if
#ifdef MUTANT_NO_UNIQUE_INDEX
	:: i < NROWS -> setRow(i, FAIL, fp, me, 1, me); res = OK
#else
	:: i < NROWS && !EXISTS -> setRow(i, FAIL, fp, me, 1, me); res = OK
#endif
	:: else -> res = TAKEN
	fi
}

/*
 * COMMIT of the transaction that holds rows as lock id t, made by attempt
 * x: its writes become visible and its order exists. S1 and S4 are checked
 * here. e is the retention period of the record the attempt holds
 * (claim-first) or inserts (single-phase), f its request's fingerprint.
 */
inline commitTx(t, x, e, f) {
	for (i : 0 .. NROWS - 1) {
		if
		:: row[i].lock == t ->
			if
			:: row[i].st == NONE ->  /* its InsertFinal */
				setRow(i, row[i].pst, row[i].pfp, x, 1, row[i].psnap)
			:: else ->               /* its FinishTx */
				row[i].st = row[i].pst; row[i].snap = row[i].psnap; row[i].ver = row[i].pver; row[i].lexp = 0
			fi;
			/* S4: an order commits only with a record of its own request's fingerprint */
			assert(row[i].fp == f);  /* S4 */
			/* ... in the retention period its request held the key for */
			assert(row[i].ep == e);  /* S4 */
			row[i].lock = 0; row[i].pst = NONE; row[i].pfp = 0; row[i].psnap = 0; row[i].pver = 0
		:: else
		fi
	}
	/* S1: at most one order per key and retention period */
	assert(ord[e] == 0);  /* S1 */
	ord[e] = x; ordFp[e] = f; i = 0
}

inline rollbackTx(t) {
	for (i : 0 .. NROWS - 1) {
		if
		:: row[i].lock == t ->
			row[i].lock = 0; row[i].pst = NONE; row[i].pfp = 0; row[i].psnap = 0; row[i].pver = 0
		:: else
		fi
	}
	i = 0
}

/* A COMMIT whose reply is lost while the server still commits: the
 * transaction no longer belongs to the attempt (its connection is gone);
 * the Clock ends it. Its rows are held as LIMBO meanwhile. */
#define LIMBO 255
inline toLimbo() {
	for (i : 0 .. NROWS - 1) {
		if
		:: row[i].lock == me -> row[i].lock = LIMBO
		:: else
		fi
	}
	lbId = me; lbEp = hep; lbFp = fp; i = 0
}
