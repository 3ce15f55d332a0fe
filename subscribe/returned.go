package subscribe

// This file: handing back, at a graceful stop, the messages that failed
// here and wait for a retry held in process (driver.Returner).

import (
	"context"
	"time"

	"github.com/keyorder/keyorder/driver"
)

// ranHere reports whether it failed in this process and waits for a retry
// held in process: its attempt count rose here (decide), so handing it
// back uncounted (Release) would forget those attempts.
func (s *Subscriber) ranHere(it *item) bool {
	return it.attempt > max(it.m.Attempt, 1)
}

// giveBackAtStop gives back what the lanes held when Run stopped
// gracefully, and what a cut gives back (cutBack). Where the driver implements driver.Returner, the messages
// that failed here and wait for a retry go back through Return, with the
// attempts they used and what is left of their retry delay, so that a
// rolling deploy neither resets a poison message's count nor reruns it
// before its RetryAfter; the rest, never run, go back through Release
// first (a message Returned is then the key's first to come back). Without
// Returner all go through Release, which counts nothing.
func (s *Subscriber) giveBackAtStop(its []*item) {
	r, ok := s.drv.(driver.Returner)
	if !ok {
		s.giveBack(its)
		return
	}
	var back, ret []*item
	for _, it := range its {
		if s.ranHere(it) || it.unrun > 0 {
			// Failed here, or recorded as started where it never ran:
			// its count is this process's.
			ret = append(ret, it)
		} else {
			back = append(back, it)
		}
	}
	s.giveBack(back)
	if len(ret) == 0 {
		return
	}
	now := time.Now()
	rs := make([]driver.Returned, 0, len(ret))
	for _, it := range ret {
		var nb time.Time
		if at := s.born.Add(it.due); at.After(now) {
			nb = at
		}
		rs = append(rs, driver.Returned{Message: it.m, Attempts: it.attempt - 1, NotBefore: nb})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.detach(ret...)
	err := s.retrySettle(ctx, func(ctx context.Context) error { return r.Return(ctx, rs) })
	if err != nil {
		s.stats.SettleFailures.Add(1)
		s.cfg.Logger.Warn("keyorder: returning messages that wait for a retry failed; the broker will redeliver them, their attempts here uncounted", "count", len(rs), "err", err)
	}
	s.forgetAll(ret)
}
