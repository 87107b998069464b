/*
 * cache.pml: the in-process replay cache (cache.go) and the SharedCache
 * pre-filter (shared.go, over redis/idemredis.go).
 *
 * In-process: one slot stands for the caches of every instance. Only final
 * records enter it (a committed record read by lookup, or one this process
 * just finished: cacheOwn), and a request may always miss it (another
 * instance, an eviction): since every entry of one retention period is a
 * copy of the same final record, one slot with a nondeterministic miss
 * covers any number of instances.
 *
 * Shared: a replay entry, which GetReplay may answer or miss (none,
 * evicted, a timeout, Redis down: the middleware fails open) and PutReplay
 * may fail to store; Redis may lose its data (Clock, RFLUSH). With STALE an
 * entry may outlive its record's retention ("stale").
 *
 * In-flight markers never decide anything: they can only make a request
 * answer in progress (409/503 with Retry-After) instead of going to the
 * Store. For safety the model lets any request be answered so at the start
 * (a marker of this fingerprint held by an attempt alive or dead), which
 * covers every marker and every Redis failure. With MARKERS, for the
 * liveness check, markers are modeled as they are: SET NX with the lease as
 * TTL, removed by their owner after it answered; a call may fail (rfaults, a
 * timeout or Redis down); a marker left behind expires once its owner has
 * gone (Clock).
 */

byte lcSt, lcFp, lcSnap, lcEp;   /* in-process replay cache (all instances) */
#ifdef SHARED
byte shSt, shFp, shSnap, shEp;   /* the SharedCache's replay entry */
#ifdef MARKERS
byte mkOwn, mkFp;                /* its in-flight marker: owner and fingerprint */
#endif
#endif

inline cachePut(s, f, sn, e) {
	lcSt = s; lcFp = f; lcSnap = sn; lcEp = e;
#ifdef SHARED
	if
	:: shSt = s; shFp = f; shSnap = sn; shEp = e
	:: true                      /* PutReplay failed */
	fi
#endif
}

/* cacheOwn: a record this attempt just finished, in the period it held. */
inline cacheOwn(s) {
	atomic { cachePut(s, fp, me, hep) }
}

/* the in-process cache's entry as the record to answer from */
inline readLocal() {
	rSt = lcSt; rFp = lcFp; rSnap = lcSnap; rEp = lcEp; rOk = S3OK(lcEp);
	rOwn = 0; rVer = 0; rLexp = 0; rRexp = 0;
	MIRROR
}

#ifdef SHARED
/* replayable: the same fingerprint, final, with a snapshot (shared.go) */
#define SHARED_HIT (shSt != NONE && shFp == fp)

inline readShared() {
	rSt = shSt; rFp = shFp; rSnap = shSnap; rEp = shEp; rOk = S3OK(shEp);
	rOwn = 0; rVer = 0; rLexp = 0; rRexp = 0;
	MIRROR;
	/* replayFromShared puts it in this process's cache */
	lcSt = shSt; lcFp = shFp; lcSnap = shSnap; lcEp = shEp
}

#ifdef MARKERS
/* MarkInFlight (SET NX GET): sets held/heldFp and set. A failed call
 * (rfaults) reports nothing set, or, timed out after it may have reached
 * Redis, set whether it was or not. */
inline markInFlight() {
	atomic {
		held = 0; set = 0;
		if
		:: mkOwn == 0 -> mkOwn = me; mkFp = fp; set = 1
		:: mkOwn != 0 -> held = 1; heldFp = mkFp
		:: TAKE(rfaults)                   /* failed or skipped: nothing set */
		:: TAKE(rfaults); set = 1;         /* timed out after it may have reached Redis */
			if
			:: mkOwn == 0 -> mkOwn = me; mkFp = fp
			:: true
			fi
		fi
	}
}

/* UnmarkInFlight: removes the marker if this attempt still holds it, or
 * fails (rfaults) and leaves it. */
inline unmark() {
	atomic {
		if
		:: marked && mkOwn == me -> mkOwn = 0; mkFp = 0
		:: marked && mkOwn == me && TAKE(rfaults)
		:: else
		fi;
		marked = 0
	}
}
#endif
#endif
#ifndef MARKERS
inline unmark() { skip }
#endif
