package subscribe

// This file: telling a driver that handlers start (driver.StartRecorder),
// so that a lost lease counts an attempt only for messages that ran.

import (
	"context"
	"math"

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

// unrunNote is what unrunStarts keeps for a message: the broker's copy of
// the delivery (driver.Message.Copy) and how many of its recorded starts
// never ran.
type unrunNote struct {
	copy any
	n    int
}

// noteUnrun remembers the unrun starts of it, which goes back to the broker
// (released, or its lease lost) with them on the broker's count. A driver
// that records starts counts them (driver.StartRecorder: "once with all the
// members that run"), but a message is dead-lettered for its attempts only
// after runs of its own: its redelivery here takes them off (takeUnrun).
// Another process cannot; where the driver is a driver.Returner, a message
// cut here goes back through Return with its own count instead
// (giveBackAtStop).
func (s *Subscriber) noteUnrun(it *item) {
	if it.unrun > 0 {
		s.unrunStarts.put(it.m.ID, unrunNote{copy: it.m.Copy, n: int(it.unrun)})
	}
}

// takeUnrun takes off a received message's attempt the starts noted for
// an earlier delivery of the same copy that never ran (noteUnrun), and
// keeps them on the item in case it goes back again.
func (s *Subscriber) takeUnrun(it *item) {
	n, ok := s.unrunStarts.get(it.m.ID)
	if !ok {
		return
	}
	s.unrunStarts.remove(it.m.ID)
	if n.copy != it.m.Copy {
		return // redriven or published again: a count of its own
	}
	it.attempt = max(it.m.Attempt-n.n, 1)
	it.unrun = uint16(min(n.n, math.MaxUint16))
}
