/*
 * client.pml: a client that sends one request (fingerprint fp) with the
 * key, and sends it again after every answer that is not final, until it
 * gets a final one: a success, a rejection, or a conflict. Each sending is
 * an attempt (attempt in idempotency.go) with an owner id of its own; an
 * attempt may crash at any step (crashes), which the client sees as a
 * dropped connection and retries.
 *
 * Labels are named after the functions of idempotency.go (claim-first),
 * singlephase.go and shared.go that they model; model/README.md maps them.
 */

/* S5: client k's handler does not run beside this one's, or one of the two
 * outlived its lease */
#define ALONE(k) (c == k || exe[k] != RUNNING || exeExp[k] || exeExp[c])

/* mayTakeOver (idempotency.go) */
#ifdef MUTANT_TAKEOVER_UNEXPIRED
#define MAYTAKEOVER (rRexp || (rSt != NONE && rFp == fp))
#else
#define MAYTAKEOVER (rRexp || (rSt == PROC && rLexp && rFp == fp))
#endif

/* handler verdicts (verdict in idempotency.go) */
#define COMMIT 0   /* 2xx: commit with the snapshot */
#define REJECT 1   /* a final non-2xx: roll back, store the answer */
#define RETRY 2    /* a non-final 5xx (or a panic): roll back, release */

#define CRASHPOINT \
	if \
	:: atomic { TAKE(crashes) }; goto crashed \
	:: true \
	fi

/* S2: an answer that reports success is the order committed in its
 * retention period, made for a request with this fingerprint. */
inline success(s, e) {
	d_step {
		assert(s != 0 && ord[e] == s && ordFp[e] == fp);  /* S2 */
		fin[c] = 1
	}
	goto answered
}

/* S3: a final answer that is not a success (a rejection, a conflict) is
 * never given while an order for this fingerprint is committed in the
 * period it comes from. ok was judged at the read that decided it. */
inline finalNo(ok) {
	d_step { assert(ok); fin[c] = 1 }  /* S3 */
	goto answered
}

/* allocOwner: the lowest owner id that nothing refers to */
inline allocOwner() {
	me = 1;
	do
	:: me <= MAXID && REFD(me) -> me++
	:: else -> break
	od;
	assert(me <= MAXID);  /* M: the model's owner ids suffice */
	cur[c] = me
}

/* newOwner: a fresh owner id for the attempt: the lowest id that nothing
 * in the state refers to, which is as good as a fresh random one. */
inline newOwner() {
	d_step {
		rSt = 0; rFp = 0; rOwn = 0; rVer = 0; rSnap = 0;
		rLexp = 0; rRexp = 0; rEp = 0; rOk = 0;
		MIRROR;
		allocOwner();
		exe[c] = 0; exeExp[c] = 0;
		renewing = 0; again = 0; hb = 0; nrun = 0; lver = 0; fver = 0; hep = 0; rounds = 0;
		collided = 0; marked = 0; held = 0; set = 0; heldFp = 0; ok3 = 0; verdict = 0
	}
}

proctype Client(byte c; byte fp) {
	byte me, res, i, rounds, nrun, lver, fver, hep, rr, verdict, heldFp;
	bit renewing, again, hb, collided, held, set, marked, ok3;
	/* the record last read (lookup, or a cache entry) */
	byte rSt, rFp, rOwn, rVer, rSnap, rEp;
	bit rLexp, rRexp, rOk;

start:
	newOwner();

	/* A finished key this process has seen is answered from its cache. */
	if
	:: atomic { lcSt != NONE -> readLocal() }; goto respond
	:: true
	fi;

#ifdef SHARED
	/* preFilter: the SharedCache's replay, then its in-flight marker */
	if
	:: atomic { SHARED_HIT -> readShared() }; goto respond
	:: true
	fi;
#ifdef MARKERS
	markInFlight();
	if
	:: set -> marked = 1
	:: !set && held && heldFp == fp -> goto retry   /* in progress elsewhere */
	:: else                                         /* the Store decides */
	fi;
#else
	/* a marker with this fingerprint, live or stale, may be held: then the
	 * answer is in progress; otherwise the Store decides (see cache.pml) */
	if
	:: goto retry
	:: true
	fi;
#endif
#endif

#ifdef SINGLEPHASE
	goto serveSinglePhase;
#endif

serveClaimFirst:
	rounds = 0;
claimLoop:
	/* claim: Claim, and on a taken key (or a reply lost) the record */
	if
	:: rounds == MAXROUNDS -> goto retry            /* errKeyChurn: 503 */
	:: else -> rounds++
	fi;
#ifndef MUTANT_REUSED_OWNER
	/* a fresh owner for every Claim after the first (claim.go), so that no
	 * two records of the key ever carry the same owner and version; found
	 * by this model (S5) */
	if
	:: rounds > 1 -> atomic { cur[c] = 0; allocOwner() }
	:: else
	fi;
#endif
	claimStmt();
	if
	:: res == OK -> lver = 1; goto claimed
	:: else
	fi;
	lookup();
	if
	:: res == NOTFOUND -> goto claimLoop
	:: res == ERR -> goto retry                      /* 503 */
	:: else
	fi;
	if
	:: rSt == PROC && rOwn == me ->
		/* our INSERT landed: renew the lease, fenced */
		extendStmt(me, rVer);
		if
		:: res == OK -> lver = rVer + 1; hep = rEp; goto claimed
		:: res == LOST -> goto claimLoop
		:: else -> goto retry
		fi
	:: else
	fi;
	if
	:: MAYTAKEOVER ->
		takeOverStmt(rOwn, rVer);
		if
		:: res == OK -> lver = rVer + 1; goto claimed
		:: res == LOST -> goto claimLoop
		:: else -> goto retry
		fi
	:: else -> goto respond
	fi;

claimed:
	atomic { rSt = 0; rFp = 0; rOwn = 0; rVer = 0; rSnap = 0; rLexp = 0; rRexp = 0; rEp = 0; rOk = 0; rounds = 0; MIRROR }
	/* execute: runHandler in a transaction */
handler:
	atomic {
		/* S5: no other handler of the key runs, unless one of the two outlived its lease */
		assert(ALONE(0) && ALONE(1) && ALONE(2));  /* S5 */
		exe[c] = RUNNING
	}
#ifndef NOHEARTBEAT
	/* ExtendLease, the handler's heartbeat: once, and only once the lease
	 * has expired, since before that it changes nothing anyone can see but
	 * the version (see README) */
	if
	:: atomic { !hb && EXPIRED -> hb = 1; extendDo(me, lver); i = 0 };
		if
		:: res == OK -> lver++
		:: else          /* lost: the handler carries on (the worst case) */
		fi
	:: true
	fi;
#endif
	CRASHPOINT;
	if
	:: verdict = COMMIT
	:: verdict = REJECT
	:: atomic { TAKE(fails); verdict = RETRY }
	fi;
	d_step { exe[c] = 0; exeExp[c] = 0; hb = 0 }
	if
	:: renewing && verdict == RETRY && !again ->
		/* runAgain: roll back, extend the lease (fenced), run once more */
		again = 1;
		extendStmt(me, lver);
		if
		:: res == OK -> lver++; goto handler
		:: res == LOST -> goto answerCurrentOwner
		:: else -> goto releaseAndAnswer
		fi
	:: else
	fi;
	/* finalize */
	if
	:: verdict == COMMIT -> goto commit
	:: verdict == REJECT -> goto storeRejection
	:: else ->
		/* releaseAndPassThrough: release (fenced), the handler's 5xx */
		releaseStmt(me, lver);
		goto retry
	fi;

commit:
	finishTxStmt();
	if
	:: res == LOST -> goto answerCurrentOwner
	:: res == ERR -> goto releaseAndAnswer
	:: else
	fi;
	fver = lver + 1;
#ifdef MUTANT_CACHE_BEFORE_COMMIT
	cacheOwn(DONE);
#endif
	atomic {
		if
		:: commitTx(me, me, hep, fp); res = OK
		:: TAKE(lost); commitTx(me, me, hep, fp); res = ERR   /* committed, the reply lost */
		:: TAKE(lost); rollbackTx(me); res = ERR          /* rolled back, the reply lost */
		:: TAKE(lost); toLimbo(); res = ERR  /* still committing */
		fi
	}
	if
	:: res == OK ->
		CRASHPOINT;
		cacheOwn(DONE);
		success(me, hep)
	:: else
	fi;
	/* resolveCommit: read the record; only a fenced release proves nothing committed */
	rr = 0;
	do
	:: rr == 2 -> goto retry                        /* commit-outcome-unknown: 503 */
	:: else -> rr++;
		lookup();
		if
		:: res == ERR -> goto retry                 /* unknown */
		:: res == OK && FINAL(rSt) && rOwn == me && rVer == fver ->
			success(me, hep)
		:: res == OK && rSt == PROC && rOwn == me && rVer == lver ->
			releaseStmt(me, lver);
			if
			:: res == OK -> goto retry              /* answerReleased: 503 */
			:: res == LOST                          /* read again */
			:: else -> goto retry                   /* unknown */
			fi
		:: else -> goto answerCurrentOwner
		fi
	od;

storeRejection:
	/* the transaction is rolled back; Finish(FAILED) in autocommit, fenced */
	atomic {
		FREE(me);
		ok3 = S3OK(hep);
		LANDED_OR_NOT(finishDo(me, lver, FAIL, me));
		i = 0
	}
	if
	:: res == LOST -> goto answerCurrentOwner
	:: res == ERR ->
		/* not stored: the key is released and the rejection answered */
		releaseStmt(me, lver);
#ifndef MUTANT_REJECTION_AFTER_LOST_LEASE
		/* a release that matched nothing means another attempt owns the
		 * key (or our Finish landed): answer from the record
		 * (storeRejection, finalize.go); found by this model (S3) */
		if
		:: res == LOST -> goto answerCurrentOwner
		:: else
		fi;
#endif
		finalNo(ok3)
	:: else ->
		cacheOwn(FAIL);
		finalNo(ok3)
	fi;

releaseAndAnswer:
	releaseStmt(me, lver);
	if
	:: res == LOST -> goto answerCurrentOwner
	:: else -> goto retry                           /* answerReleased: 503 */
	fi;

answerCurrentOwner:
	lookup();
	if
	:: res == OK -> goto respond
	:: else -> goto retry
	fi;

respond:
	/* respondToDuplicate */
	if
	:: rFp != fp -> finalNo(rOk)           /* conflict: 409 */
	:: rFp == fp && rSt == DONE -> success(rSnap, rEp)
	:: rFp == fp && rSt == FAIL ->
		finalNo(rOk)                            /* the stored rejection */
	:: else -> goto retry                           /* in progress: 409/503 Retry-After */
	fi;

#ifdef SINGLEPHASE
serveSinglePhase:
	/* replayHint: read the record first, or not */
	if
	:: lookup();
		if
		:: res == OK && MAYTAKEOVER -> renewing = 1; goto serveClaimFirst
		:: res == OK -> goto respond
		:: else
		fi
	:: true
	fi;
	nrun = 1;
spRun:
	/* executeSinglePhase: the handler runs at once */
	atomic { rSt = 0; rFp = 0; rOwn = 0; rVer = 0; rSnap = 0; rLexp = 0; rRexp = 0; rEp = 0; rOk = 0; MIRROR }
#ifdef MARKERS
	CRASHPOINT;  /* leaves its in-flight marker behind */
#endif
	if
	:: verdict = COMMIT
	:: verdict = REJECT
	:: atomic { TAKE(fails); verdict = RETRY }
	fi;
	if
	:: verdict == COMMIT ->
		/* commitSinglePhase: InsertFinal as the last statement */
		insertFinalTxStmt();
		if
		:: res == TAKEN -> collided = 1; goto answerWinner
		:: res == ROLLEDBACK -> goto afterRollback
		:: else
		fi;
#ifdef MUTANT_CACHE_BEFORE_COMMIT
		hep = epoch;
		cacheOwn(DONE);
#endif
		atomic {
			hep = epoch;
			if
			:: commitTx(me, me, hep, fp); res = OK
			:: TAKE(lost); commitTx(me, me, hep, fp); res = ERR
			:: TAKE(lost); rollbackTx(me); res = ERR
			:: TAKE(lost); rollbackTx(me); res = ROLLEDBACK  /* a rollback at COMMIT */
			:: TAKE(lost); toLimbo(); res = ERR
			fi
		}
		if
		:: res == OK ->
			CRASHPOINT;
			cacheOwn(DONE);
			success(me, hep)
		:: res == ROLLEDBACK -> goto afterRollback
		:: else
		fi;
		/* resolveSinglePhaseCommit */
		lookup();
		if
		:: res == OK && rOwn == me -> success(me, rEp)
		:: res == OK -> goto respond
		:: else -> goto retry                       /* commit-outcome-unknown: 503 */
		fi
	:: verdict == REJECT ->
		/* storeRejectionSinglePhase: InsertFinal(FAILED) in autocommit */
		atomic {
			NOPEND(me);
			ok3 = S3OK(epoch); hep = epoch;
			LANDED_OR_NOT(insertFailedDo());
			i = 0
		}
		if
		:: res == TAKEN -> collided = 1; goto answerWinner
		:: res == ERR -> goto retry
		:: else ->
			cacheOwn(FAIL);
			finalNo(ok3)
		fi
	:: else ->
		/* a non-final answer: maybe a concurrent winner's doing */
		collided = 0; goto answerWinner
	fi;

answerWinner:
	lookup();
	if
	:: res == NOTFOUND && collided -> renewing = 1; goto serveClaimFirst
	:: res != OK -> goto retry                      /* 503, or the handler's 5xx */
	:: res == OK && MAYTAKEOVER -> renewing = 1; goto serveClaimFirst
	:: else -> goto respond
	fi;

afterRollback:
	lookup();
	if
	:: res == OK && !MAYTAKEOVER -> goto respond
	:: ((res == OK && MAYTAKEOVER) || res == NOTFOUND) && nrun < MAXRUNS -> nrun++; goto spRun
	:: else -> goto retry                           /* 503 */
	fi;
#endif


retry:
	/* a retryable answer (503, in progress, the handler's 5xx): send again */
	assert(!LOCKS(me));  /* M: an attempt that answers holds no row */
	unmark();
	cur[c] = 0;
	goto start;

crashed:
	/* the connection drops: the database rolls back the open transaction */
	atomic { rollbackTx(me); cur[c] = 0; marked = 0; exe[c] = 0 }
	goto start;

answered:
	assert(!LOCKS(me));  /* M: an attempt that answers holds no row */
	unmark();
	cur[c] = 0
}
