package subscribe

// This file: taking back, synchronously, what a driver's broker moved to
// another process (driver.Revocable).

import (
	"context"
	"time"

	"github.com/keyorder/keyorder/driver"
)

// revoke is the function handed to a driver.Revocable driver (SetRevoke,
// before the first Receive). It takes back every outstanding message that
// selected picks: one that has not started is revoked under its mu (lost
// and fenced), so prepare, which makes a member the attempt's under the
// same mu, never runs it; it leaves the outstanding set at once (no more
// renewals) and, wherever it waits (a lane, a parked retry, a throttle, a
// barrier, an open batch), is dropped without a driver call when its turn
// comes. One that is running has its context cancelled, and revoke waits
// until its handler has returned, or ctx ends; what it returns is not
// settled (fenced: decide drops it, the acker skips it). It returns the
// selected messages still running when ctx ended.
func (s *Subscriber) revoke(ctx context.Context, selected func(*driver.Message) bool) []*driver.Message {
	var running []*item
	toks := 0
	s.mu.Lock()
	// Messages a Receive returned that the pump has not registered yet
	// are revoked when it does (revokeReceived).
	s.revocations = append(s.revocations, revocation{gen: s.revokeGen.Add(1), selected: selected})
	var revoked []*item
	for it := s.outstanding.head; it != nil; {
		next := it.nextO
		if selected(it.m) {
			revoked = append(revoked, it)
			it.mu.Lock()
			it.fenced.Store(true)
			it.lost.Store(true)
			hctx := it.hctx
			it.mu.Unlock()
			if hctx != nil {
				hctx.cancel()
				running = append(running, it)
			} else {
				s.removeOutstanding(it)
				if it.hasToken {
					it.hasToken = false
					toks++
				}
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
	if len(running) == 0 {
		return nil
	}
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for {
		still := running[:0]
		for _, it := range running {
			it.mu.Lock()
			if it.hctx != nil {
				still = append(still, it)
			}
			it.mu.Unlock()
		}
		running = still
		if len(running) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			ms := make([]*driver.Message, len(running))
			for i, it := range running {
				ms[i] = it.m
			}
			return ms
		case <-t.C:
		}
	}
}

// revocation is one call of revoke, for the messages a Receive returned
// before it and the pump had not registered yet.
type revocation struct {
	gen      uint64
	selected func(*driver.Message) bool
}

// revokeReceived applies the revocations made since a Receive began (gen
// was revokeGen then) to what it returned, just registered as
// outstanding: the selected leave the outstanding set, lost and fenced,
// and are dropped when their turn comes. It returns the tokens to
// release. Every revocation made so far is then applied to everything
// registered, so the list is emptied. Called with s.mu held.
func (s *Subscriber) revokeReceived(its []*item, gen uint64) int {
	toks := 0
	var revoked []*item
	for _, r := range s.revocations {
		if r.gen <= gen {
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
	clear(s.revocations)
	s.revocations = s.revocations[:0]
	return toks
}
