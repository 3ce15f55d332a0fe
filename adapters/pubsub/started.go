package pubsub

// This file: the start store (SubscriptionOptions.StartStore,
// driver.StartRecorder).

import (
	"context"
	"fmt"

	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/driverkit"
)

// recordingDriver is the driver of a subscription with a start store: the
// driver and driver.StartRecorder.
type recordingDriver struct{ *subscriptionDriver }

var _ driver.StartRecorder = recordingDriver{}

// portable returns what the subscriber is given: s, or s recording starts
// when it has a start store.
func (s *subscriptionDriver) portable() driver.Subscription {
	if s.starts != nil {
		return recordingDriver{s}
	}
	return s
}

// Started records that the handlers of ms start (driver.StartRecorder):
// lazily, after the start log's delay, unless one of ms came back after a
// loss its record does not explain (its earlier deliveries outnumber its
// recorded runs): then before it returns. Runs the subscriber retries in
// process are counted too (each is a start), so a crash after them no
// longer forgets them.
func (r recordingDriver) Started(ctx context.Context, ms []*driver.Message) error {
	marks := make([]*driverkit.StartMark, 0, len(ms))
	for _, m := range ms {
		if d, ok := m.AckID.(*delivery); ok && d.mark != nil {
			marks = append(marks, d.mark)
		}
	}
	if err := r.starts.Started(ctx, marks); err != nil {
		return fmt.Errorf("pubsub: record started: %w", err)
	}
	return nil
}

// resolveRuns sets the Attempt of pulled messages from their recorded
// runs plus this one. Only messages the service delivered before (delivery
// attempt above 1) are looked up. While the store cannot be read, a
// message counts its deliveries less one: a crash may then be charged to a
// message that did not run, but one delivery fewer than without a store,
// so that the subscriber, which trusts a recorded count to the attempt
// limit, still gives a message whose count crashes used up one run.
func (s *subscriptionDriver) resolveRuns(ctx context.Context, ms []*driver.Message) {
	marks := make([]*driverkit.StartMark, len(ms))
	for i, m := range ms {
		marks[i] = m.AckID.(*delivery).mark
	}
	if err := s.starts.Resolve(context.WithoutCancel(ctx), marks); err != nil {
		s.log.Warn("keyorder pubsub: reading the start store failed; attempts are counted from deliveries",
			"subscription", s.name, "count", len(ms), "err", err)
	}
	for _, m := range ms {
		mk := m.AckID.(*delivery).mark
		switch {
		case mk.Earlier <= 0:
			// First delivery: nothing recorded.
		case mk.Failed():
			m.Attempt = max(m.Attempt-1, 1)
		default:
			m.Attempt = mk.Runs() + 1
		}
	}
}

// flushRuns writes m's unwritten runs before it goes back to Pub/Sub, so
// that the next consumer reads them; a failure is logged (m then runs once
// more uncounted at worst).
func (s *subscriptionDriver) flushRuns(ctx context.Context, m *driver.Message) {
	if s.starts == nil {
		return
	}
	d, ok := m.AckID.(*delivery)
	if !ok || d.mark == nil {
		return
	}
	if err := s.starts.Flush(ctx, []*driverkit.StartMark{d.mark}); err != nil {
		s.log.Warn("keyorder pubsub: recording a returned message's runs failed; its next delivery may count one attempt fewer",
			"subscription", s.name, "id", m.ID, "err", err)
	}
}

// settled tells the start log that ms are acknowledged.
func (s *subscriptionDriver) settled(ms []*driver.Message) {
	if s.starts == nil {
		return
	}
	marks := make([]*driverkit.StartMark, 0, len(ms))
	for _, m := range ms {
		if d, ok := m.AckID.(*delivery); ok && d.mark != nil {
			marks = append(marks, d.mark)
		}
	}
	s.starts.Settled(marks)
}
