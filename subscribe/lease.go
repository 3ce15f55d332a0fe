package subscribe

// This file: keeping leases alive while messages are held or handled.

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/keyorder/keyorder/driver"
)

// keepLeases renews the leases of outstanding messages and cancels the
// handlers of those whose lease was lost.
func (s *Subscriber) keepLeases(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	if s.caps.LeaseDuration <= 0 {
		<-ctx.Done()
		return
	}
	// A renewal that fails retryably is tried again after settleBackoff
	// (never later than the regular period); the next round collects the
	// messages still outstanding then, so a message settled meanwhile is
	// not renewed after its settlement.
	period := s.caps.LeaseDuration / 3
	t := time.NewTimer(period)
	defer t.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		next := period
		if back := s.expireBarriers(time.Now()); len(back) > 0 {
			s.cutBack(back)
		}
		s.mu.Lock()
		if s.outstanding.n == 0 {
			s.mu.Unlock()
			failures = 0
			t.Reset(next)
			continue
		}
		round := make(chan struct{})
		ms := make([]*driver.Message, 0, s.outstanding.n)
		byMsg := make(map[*driver.Message]*item, s.outstanding.n)
		for it := s.outstanding.head; it != nil; it = it.nextO {
			ms = append(ms, it.m)
			byMsg[it.m] = it
			it.round = round
		}
		s.mu.Unlock()
		lost, err := s.drv.ExtendLeases(ctx, ms)
		close(round)
		switch {
		case err == nil:
			failures = 0
		case s.drv.IsRetryable(err) && failures+1 < settleTries:
			failures++
			s.stats.SettleRetries.Add(1)
			next = min(next, settleBackoff.Backoff(failures))
			s.cfg.Logger.Debug("keyorder: extending leases failed; retrying", "err", err, "failures", failures)
		default:
			failures = 0
			s.stats.SettleFailures.Add(1)
			s.cfg.Logger.Warn("keyorder: extending leases failed", "err", err)
		}
		t.Reset(next)
		if len(lost) == 0 {
			continue
		}
		// An item settled while its lease was being extended is reported
		// lost by brokers that forget settled messages: it was not.
		var gone []*item
		s.mu.Lock()
		for _, m := range lost {
			if it := byMsg[m]; it != nil && !it.lost.Load() {
				if it.inOut {
					gone = append(gone, it)
				}
			}
		}
		s.mu.Unlock()
		// Mark later items first, and all before cancelling any handler: a
		// lane that sees an item lost then sees its lost successors lost
		// too, and does not run one in the moment between.
		slices.SortFunc(gone, func(a, b *item) int { return cmp.Compare(b.seq, a.seq) })
		s.mu.Lock()
		s.leaseLost(gone)
		s.mu.Unlock()
		for _, it := range gone {
			it.lost.Store(true)
		}
		for _, it := range gone {
			s.stats.LeasesLost.Add(1)
			it.mu.Lock()
			if it.hctx != nil {
				it.hctx.cancel()
			}
			it.mu.Unlock()
		}
	}
}
