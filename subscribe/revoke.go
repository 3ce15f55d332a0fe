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
	for it := s.outstanding.head; it != nil; {
		next := it.nextO
		if selected(it.m) {
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
