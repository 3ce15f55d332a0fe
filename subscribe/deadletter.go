package subscribe

// This file: the portable dead-letter operations.

import (
	"context"
	"fmt"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
)

// DeadLetters lists up to limit of the subscription's dead letters, oldest
// first (limit <= 0 lists them all), if the backend keeps them where they can
// be listed; else it fails with keyorder.ErrUnsupported.
func (s *Subscriber) DeadLetters(ctx context.Context, limit int) ([]keyorder.DeadLetter, error) {
	st, ok := s.drv.(driver.DeadLetterStore)
	if !ok {
		return nil, fmt.Errorf("dead letters: %w", keyorder.ErrUnsupported)
	}
	dls, err := st.DeadLetters(ctx, limit)
	if err != nil {
		return nil, driver.WrapError("dead letters", err, s.drv.ErrorCode)
	}
	out := make([]keyorder.DeadLetter, len(dls))
	for i, dl := range dls {
		out[i] = keyorder.DeadLetter{Message: dl.Message.Portable(), Reason: dl.Reason, Attempts: dl.Attempts, DeadAt: dl.DeadAt}
	}
	return out, nil
}

// Redrive puts the dead letters with these message IDs back on the
// subscription, after everything that arrived meanwhile, with a fresh
// attempt count, and returns how many it redrove. It fails with
// keyorder.ErrUnsupported where the backend keeps no dead letters it can
// redrive. IDs that are not dead letters of the subscription (never
// dead-lettered, redriven already, unknown) do not stop it: it redrives
// the others and then fails with a *keyorder.NotDeadLetterError naming
// them (it matches keyorder.ErrNotFound).
func (s *Subscriber) Redrive(ctx context.Context, ids []string) (int, error) {
	st, ok := s.drv.(driver.DeadLetterStore)
	if !ok {
		return 0, fmt.Errorf("redrive: %w", keyorder.ErrUnsupported)
	}
	n, err := st.Redrive(ctx, ids)
	if n > 0 {
		// A redriven message runs, even where the driver names no copies
		// (undeadNote).
		for _, id := range ids {
			s.undead.remove(id)
		}
	}
	return n, driver.WrapError("redrive", err, s.drv.ErrorCode)
}

// undeadNote returns the note a DeadLetter call left for m (see
// deadLetterAs), if m is a redelivery of the copy the call was made on:
// that copy's fate is decided, so it does not run (redeliveredDead).
//
// A call that failed may have taken effect all the same (the broker acted;
// its answer was lost). Then the message comes back only redriven, by this
// Subscriber's Redrive or by another process's (`keyorder dead redrive`):
// a new copy with a fresh attempt count, which must run. So a note applies
// to the copy it was made on (driver.Message.Copy), not to the message ID.
// Where the driver names no copies, it applies to a delivery whose attempt
// is higher than the one the call was made on: the lost lease of a message
// that ran counts an attempt, and a redrive starts the count afresh. (A
// broker that counts no attempts then never dead-letters a redelivery
// again: the message runs again, at least once, rather than a redriven
// message never running.)
func (s *Subscriber) undeadNote(m *driver.Message) (deadNote, bool) {
	dn, ok := s.undead.get(m.ID)
	if !ok {
		return dn, false
	}
	if dn.copy != nil && m.Copy != nil {
		return dn, sameCopy(dn.copy, m.Copy)
	}
	return dn, m.Attempt > dn.attempt
}

// sameCopy reports whether two driver.Message.Copy values are equal;
// values that == cannot compare (a driver breaking the contract) differ.
func sameCopy(a, b any) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a == b
}
