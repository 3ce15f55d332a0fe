package subscribe

// This file: taking back, synchronously, what a driver's broker moved to
// another process (driver.Revocable).

import (
	"context"
	"slices"

	"github.com/keyorder/keyorder/driver"
)

// revoke is the function handed to a driver.Revocable driver (SetRevoke,
// before the first Receive). It takes back every outstanding message that
// selected picks: one that has not started is revoked under its mu (lost
// and fenced), so prepare, which makes a member the attempt's under the
// same mu, never runs it; it leaves the outstanding set at once (no more
// renewals) and, wherever it waits (a lane, a parked retry, a throttle, a
// barrier, an open batch), is dropped without a driver call when its turn
// comes. One that is running is left to finish: revoke waits until its
// handler has returned and its result has reached the driver (an
// acknowledgement is made at once, on the handler's lane, not queued; a
// failure, whatever its kind, is not retried here: the message is dropped
// for the partition's next owner, its attempt counted by the driver), so a
// rebalance does not charge an attempt for, and rerun, work that finishes
// within the revocation's time. When ctx ends first, the handlers still
// running have their contexts cancelled and are fenced (what they return
// is not settled), and revoke returns their messages. A message picked by
// selected that a Receive returns while revoke runs, or that a Receive
// begun before revoke returned returns later, is revoked as it is
// registered (revokeReceived): the broker may hand out what it revokes
// until it takes it back, after revoke has returned (seed 1735 with
// KEYORDER_MODEL_CLASSES=revoke: a duplicate delivered during the wait
// ran on, and overlapped its key's next owner).
func (s *Subscriber) revoke(ctx context.Context, selected func(*driver.Message) bool) []*driver.Message {
	type wait struct {
		it *item
		ch chan struct{}
	}
	var running []wait
	toks := 0
	s.mu.Lock()
	// Messages a Receive returned that the pump has not registered yet
	// are revoked when it does (revokeReceived).
	rv := &revocation{selected: selected}
	s.revokeGen.Add(1)
	s.revocations = append(s.revocations, rv)
	defer func() {
		// Until here what a Receive returns may still be revoked: a
		// Receive begun before now that returns later too.
		s.mu.Lock()
		rv.end = s.revokeGen.Add(1)
		s.mu.Unlock()
	}()
	var revoked []*item
	for it := s.outstanding.head; it != nil; {
		next := it.nextO
		if selected(it.m) {
			it.mu.Lock()
			if it.hctx != nil {
				// Running: it finishes (see decide), and tells when
				// its result has reached the driver.
				ch := s.revokeWaits[it]
				if ch == nil {
					ch = make(chan struct{})
					if s.revokeWaits == nil {
						s.revokeWaits = map[*item]chan struct{}{}
					}
					s.revokeWaits[it] = ch
				}
				it.revoking.Store(true)
				running = append(running, wait{it, ch})
				it.mu.Unlock()
				it = next
				continue
			}
			it.fenced.Store(true)
			it.lost.Store(true)
			it.mu.Unlock()
			revoked = append(revoked, it)
			s.removeOutstanding(it)
			if it.hasToken {
				it.hasToken = false
				toks++
			}
		}
		it = next
	}
	// The broker redelivers them, here or elsewhere: under in-process
	// hold a later message of their keys that comes here first waits for
	// that redelivery (a barrier, as for a lost lease: lostkey.go).
	s.leaseLost(revoked)
	s.mu.Unlock()
	s.releaseTokens(toks)
	var still []*driver.Message
	for _, w := range running {
		select {
		case <-w.ch:
			continue
		case <-ctx.Done():
		}
		// The revocation's time is up: cancelled, and whatever it returns
		// is not settled (fenced: decide drops it, the acker skips it).
		select {
		case <-w.ch:
			continue
		default:
		}
		it := w.it
		it.mu.Lock()
		it.fenced.Store(true)
		it.lost.Store(true)
		hctx := it.hctx
		it.mu.Unlock()
		if hctx != nil {
			hctx.cancel()
		}
		still = append(still, it.m)
	}
	return still
}

// revokeSettled tells revoke that the results of the members of a run
// that were revoked while it ran have reached the driver (or been
// dropped). Called by the lane once decide has settled them.
func (s *Subscriber) revokeSettled(run []*item) {
	for _, it := range run {
		if !it.revoking.Load() {
			continue
		}
		s.mu.Lock()
		if ch := s.revokeWaits[it]; ch != nil {
			delete(s.revokeWaits, it)
			close(ch)
		}
		s.mu.Unlock()
	}
}

// revocation is one call of revoke, for the messages a Receive returns
// that revoke's walk of the outstanding set did not see: those the pump
// had not registered yet when it began, and those a Receive returns until
// it has returned (the broker takes them back only then).
type revocation struct {
	// end is revokeGen as revoke returned; 0 while it runs.
	end      uint64
	selected func(*driver.Message) bool
}

// revokeReceived applies to what a Receive returned, just registered as
// outstanding, the revocations that ran at some time since it began (gen
// was revokeGen then): those still running, and those that ended after
// gen. The selected leave the outstanding set, lost and fenced, and are
// dropped when their turn comes. It returns the tokens to release. The
// revocations that have ended are then forgotten: every later Receive
// begins after their end. Called with s.mu held.
func (s *Subscriber) revokeReceived(its []*item, gen uint64) int {
	toks := 0
	var revoked []*item
	for _, r := range s.revocations {
		if r.end != 0 && r.end <= gen {
			continue
		}
		for _, it := range its {
			if it.inOut && r.selected(it.m) {
				revoked = append(revoked, it)
				it.mu.Lock()
				it.fenced.Store(true)
				it.lost.Store(true)
				it.mu.Unlock()
				s.removeOutstanding(it)
				if it.hasToken {
					it.hasToken = false
					toks++
				}
			}
		}
	}
	s.leaseLost(revoked)
	s.revocations = slices.DeleteFunc(s.revocations, func(r *revocation) bool { return r.end != 0 })
	return toks
}
