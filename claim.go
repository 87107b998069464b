package idempotency

import (
	"errors"
	"log/slog"
)

// maxClaimRounds bounds how often a request re-reads a key whose record
// vanishes (released or purged) or changes under it before it gives up.
const maxClaimRounds = 4

// errKeyChurn means the key's record kept changing under a claim.
var errKeyChurn = errors.New("idempotency: claim: the key's record kept changing; retry")

// claim is step 4: a plain INSERT in autocommit. On a duplicate key the
// existing record is read with a fresh statement (a transaction's snapshot
// could hide the winner) and either taken over, when its lease or retention
// has expired, or returned for respondToDuplicate.
func (a *attempt) claim() (claimed bool, rec *Record, err error) {
	ctx, endStage := a.m.startStage(a.ctx, StageClaim)
	end := func(e StageEnd) { e.KeyHash = a.keyHash; endStage(e) }
	c := Claim{
		Scope: a.scope, Key: a.key, Fingerprint: a.fingerprint,
		Owner: a.m.newOwner(), Lease: a.m.cfg.Lease, Retention: a.m.cfg.Retention,
	}
	got := func(lease Lease) (bool, *Record, error) {
		a.lease = lease
		a.note(Event{Outcome: OutcomeClaimed})
		end(StageEnd{Outcome: OutcomeClaimed, Record: StatusProcessing})
		return true, nil, nil
	}
	for round := range maxClaimRounds {
		if round > 0 {
			// A fresh owner for every round: an INSERT of an earlier round
			// may have landed (its reply lost) and its record vanished
			// since; a new record with that owner would also carry its
			// version (every claim starts at 1), so a statement fenced by
			// the old record's lease, such as a stale reconciler's
			// release, could delete the new, live claim (found by the
			// model: model/README.md, S5).
			c.Owner = a.m.newOwner()
		}
		lease, claimErr := a.m.store.Claim(ctx, c)
		if claimErr == nil {
			return got(lease)
		}
		if !errors.Is(claimErr, ErrKeyClaimed) && !mayHaveLanded(claimErr) {
			end(StageEnd{Outcome: OutcomeStoreError, Err: claimErr})
			return false, nil, claimErr
		}
		// The key is taken, or the connection failed and our INSERT may
		// have landed before it did: the record says which.
		rec, err := a.lookup(ctx)
		switch {
		case errors.Is(err, ErrRecordNotFound):
			continue // released or purged since, or our INSERT never landed: claim again
		case err != nil && !errors.Is(claimErr, ErrKeyClaimed):
			err = claimErr
			fallthrough
		case err != nil:
			end(StageEnd{Outcome: OutcomeStoreError, Err: err})
			return false, nil, err
		case rec.Status == StatusProcessing && rec.Owner == c.Owner:
			// Our INSERT landed, maybe long before the error reached us:
			// renew the lease (fenced) so the handler's budget fits inside
			// it. Lost meanwhile (taken over): start again.
			lease, err := a.m.store.Extend(ctx, Lease{Scope: c.Scope, Key: c.Key, Owner: c.Owner, Version: rec.Version}, c.Lease)
			switch {
			case err == nil:
				return got(lease)
			case errors.Is(err, ErrLeaseLost):
				continue
			}
			end(StageEnd{Outcome: OutcomeStoreError, Err: err})
			return false, nil, err
		}
		if !a.mayTakeOver(rec) {
			end(StageEnd{Record: rec.Status})
			return false, rec, nil
		}
		lease, err = a.m.store.TakeOver(ctx, c, Lease{Owner: rec.Owner, Version: rec.Version})
		if err == nil {
			a.lease = lease
			a.note(Event{Outcome: OutcomeTakenOver})
			a.m.log(slog.LevelWarn, "took over an abandoned key", a.keyHash,
				"previous_owner", rec.Owner, "lease_version", lease.Version, "record_expired", rec.Expired)
			end(StageEnd{Outcome: OutcomeTakenOver, Record: StatusProcessing})
			return true, nil, nil
		}
		if !errors.Is(err, ErrLeaseLost) {
			end(StageEnd{Outcome: OutcomeStoreError, Err: err})
			return false, nil, err
		}
		// Another request took it over or removed it first: start again.
	}
	end(StageEnd{Outcome: OutcomeStoreError, Err: errKeyChurn})
	return false, nil, errKeyChurn
}

// mayTakeOver: a final record past its retention is a new key; a PROCESSING
// record whose lease expired on the same request means its attempt died, so
// this one may finish the work. (A PROCESSING record never expires by
// retention: only its lease decides.)
func (a *attempt) mayTakeOver(rec *Record) bool {
	return rec.Expired ||
		(rec.Status == StatusProcessing && rec.LeaseExpired && rec.Fingerprint == a.fingerprint)
}
