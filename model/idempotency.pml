/*
 * idempotency.pml: a SPIN model of the idempotency protocol of
 * github.com/orderguard/idempotency, both modes, one key.
 *
 *   spin -a [-DSINGLEPHASE] [-DSHARED] \
 *       [-DNCLI=2] [-DFT=2] [-DMUTANT_...] idempotency.pml
 *   gcc -O0 -DSAFETY -DNOCLAIM -o pan pan.c && ./pan -m100000 -w24   (safety)
 *   gcc -O0 -DNFAIR=3 -o pan pan.c && ./pan -a -f -m100000           (liveness)
 *
 * scripts/spin.sh runs every configuration, mutant and known issue;
 * model/README.md says what each part models, the properties, and what is
 * left out.
 *
 * Processes: NCLI clients (one request each, retried until a final
 * answer), the database clock and the database's own decisions (Clock),
 * the reconciler (Reconciler) and the purge (Purger).
 */

/* ---------------------------------------------------------------- bounds */
#ifndef NCLI
#define NCLI 3          /* clients: 0 and 1 send one request, 2 another body */
#endif
#ifndef FP1
#define FP1 0           /* the fingerprint of client 1: 1 the same request as client 0, 2 another, 0 either */
#endif
#ifndef FP2
#define FP2 2           /* the fingerprint of client 2: another body with the same key */
#endif
#ifndef MAXID
#define MAXID 7         /* owner ids: enough that a free one always exists (asserted) */
#endif
#ifndef CRASHES
#define CRASHES 1       /* attempts that crash, at any step */
#endif
#ifndef FAULTS
#define FAULTS 1        /* store statements whose reply is lost (landed or not), or that fail */
#endif
#ifndef LOSTCOMMIT
#define LOSTCOMMIT 1    /* COMMITs whose reply is lost: committed, rolled back, or still committing */
#endif
#ifndef SLOW
#define SLOW 1          /* times a running attempt outlives its lease (or its marker) */
#endif
#ifndef RENEW
#define RENEW 1         /* times a final record's retention passes */
#endif
#ifndef FAILS
#define FAILS 1         /* handler runs that answer a non-final 5xx */
#endif
#ifndef RFAULTS
#define RFAULTS 1       /* Redis calls that fail (MARKERS) */
#endif
#ifndef RFLUSH
#define RFLUSH 1        /* Redis restarts empty */
#endif
#define MAXROUNDS 4     /* maxClaimRounds (idempotency.go) */
#define MAXRUNS 3       /* maxSinglePhaseRuns (singlephase.go) */
#ifndef FT
#define FT 2            /* faults of all kinds above, and retention passing, in all */
#endif
#define NEPOCH (RENEW + 1)

/* ---------------------------------------------------------------- ghosts */
byte epoch;             /* the key's retention period: retention passing starts the next */
byte ord[NEPOCH];       /* the order committed in each period: the id of the attempt that made it */
byte ordFp[NEPOCH];     /* ... and its request's fingerprint */
byte cur[3];            /* each client's attempt in progress (owner id), 0 between attempts */
bit  fin[3];            /* each client got its final answer */

/* the owner ids in the record each client's attempt last read (its own
 * copy is local), so that ids in use are never handed out again */
byte gOwn[3], gSnap[3];
#define MIRROR gOwn[c] = rOwn; gSnap[c] = rSnap

byte rcOwn;             /* the lease owner the reconciler read */

/* S5 (claim-first): two handlers of the key run at once only if one of
 * them outlived its lease. exe: the client's attempt holds a lease granted
 * by Claim or TakeOver (GRANTED) and runs its handler (RUNNING); exeExp:
 * that lease expired by the clock since it was granted or extended. */
#define GRANTED 1
#define RUNNING 2
byte exe[3];
bit  exeExp[3];

byte lbId, lbEp, lbFp;  /* a COMMIT in limbo: reply lost, the server still deciding */

/* a fault of kind x, if its budget and the total allow: use in a guard, inside atomic */
#define TAKE(x) (x > 0 && ft > 0) -> x--; ft--

byte ft = FT;
byte crashes = CRASHES, faults = FAULTS, lost = LOSTCOMMIT, slow = SLOW, renew = RENEW, fails = FAILS;
#ifdef MARKERS
#define SHARED
#endif
#ifdef SHARED
byte rflush = RFLUSH;
#endif
#ifdef MARKERS
byte rfaults = RFAULTS;
#endif

/* S3 judged at a read: no order for this fingerprint is committed in period e */
#define S3OK(e) (!(ord[e] != 0 && ordFp[e] == fp))

#define LIVE(x) ((x) != 0 && (cur[0] == (x) || cur[1] == (x) || cur[2] == (x)))

#include "store.pml"
#include "cache.pml"

#if NROWS == 1
#define LOCKS(x) (row[0].lock == (x))
#define REFROWS(x) (row[0].own == (x) || row[0].snap == (x) || row[0].lock == (x) || row[0].psnap == (x))
#else
#define LOCKS(x) (row[0].lock == (x) || row[1].lock == (x))
#define REFROWS(x) (row[0].own == (x) || row[0].snap == (x) || row[0].lock == (x) || row[0].psnap == (x) || \
                    row[1].own == (x) || row[1].snap == (x) || row[1].lock == (x) || row[1].psnap == (x))
#endif
#define REFCLI(k, x) (cur[k] == (x) || gOwn[k] == (x) || gSnap[k] == (x))
#ifdef MARKERS
#define REFSH(x) (shSnap == (x) || mkOwn == (x))
#elif defined(SHARED)
#define REFSH(x) (shSnap == (x))
#else
#define REFSH(x) (false)
#endif
#if NEPOCH == 2
#define REFORD(x) (ord[0] == (x) || ord[1] == (x))
#else
#define REFORD(x) (ord[0] == (x))
#endif
/* an owner id that something in the state refers to */
#define REFD(x) (REFROWS(x) || REFORD(x) || lbId == (x) || lcSnap == (x) || rcOwn == (x) || REFSH(x) || \
                 REFCLI(0, x) || REFCLI(1, x) || REFCLI(2, x))

#include "client.pml"
#include "background.pml"

init {
	atomic {
		run Clock();
#ifndef NORECONCILER
		run Reconciler();
#endif
		run Purger();
		run Client(0, 1);
		if
		:: NCLI > 1 && FP1 != 0 -> run Client(1, FP1)
		:: NCLI > 1 && FP1 == 0 -> run Client(1, 1)   /* FP1 0: the same request as client 0, */
		:: NCLI > 1 && FP1 == 0 -> run Client(1, 2)   /* or another body with the same key */
		:: else
		fi;
		if
		:: NCLI > 2 -> run Client(2, FP2)
		:: else
		fi
	}
}

/* Liveness: every client gets a final answer, and the key is never left
 * PROCESSING: it ends final (or purged, or released after an unstored
 * rejection). */
#define QUIET (fin[0] && (NCLI < 2 || fin[1]) && (NCLI < 3 || fin[2]) && row[0].st != PROC)
ltl final { <> [] QUIET }
