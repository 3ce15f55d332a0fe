package subscribe

// This file: telling a driver that handlers start (driver.StartRecorder),
// so that a lost lease counts an attempt only for messages that ran.

import (
	"context"

	"github.com/keyorder/keyorder/driver"
)

// started tells a driver that records started handlers that the handler
// of run (one message, or the members of a batch, which start together)
// starts now. It runs on the item's lane right before the handler; the
// driver returns at once (it records asynchronously) except for a message
// whose earlier lease was lost before its start was recorded, which it
// records first (see driver.StartRecorder). A failure is logged and the
// handler runs anyway: at worst a lost lease then counts no attempt for
// this run, and the driver bounds that.
func (s *Subscriber) started(ctx context.Context, run []*item) {
	r, ok := s.drv.(driver.StartRecorder)
	if !ok {
		return
	}
	var ms []*driver.Message
	if len(run) == 1 {
		// A run of one (every run under Run) passes the item's own
		// one-element slice, set at receive: no allocation per message,
		// and never written again, so a driver may keep it.
		ms = run[0].started[:]
	} else {
		ms = make([]*driver.Message, len(run))
		for i, it := range run {
			ms[i] = it.m
		}
	}
	s.recordStarted(ctx, r, ms)
}

func (s *Subscriber) recordStarted(ctx context.Context, r driver.StartRecorder, ms []*driver.Message) {
	if err := r.Started(ctx, ms); err != nil {
		s.cfg.Logger.Debug("keyorder: recording a handler start failed; running it anyway",
			"id", ms[0].ID, "key", ms[0].Key, "count", len(ms), "err", err)
	}
}
