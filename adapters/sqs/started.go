package sqs

// This file: the start store (Options.StartStore, driver.StartRecorder).

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
// lazily, after driverkit.StartRecordDelay, unless one of ms came back
// after a loss its record does not explain (its earlier receives outnumber
// its recorded runs): then before it returns.
func (r recordingDriver) Started(ctx context.Context, ms []*driver.Message) error {
	marks := make([]*driverkit.StartMark, 0, len(ms))
	for _, m := range ms {
		if d, ok := m.AckID.(*delivery); ok && d.mark != nil {
			marks = append(marks, d.mark)
		}
	}
	if err := r.starts.Started(ctx, marks); err != nil {
		return fmt.Errorf("sqs: record started: %w", err)
	}
	return nil
}

// resolveRuns sets the Attempt of received messages from their recorded
// runs: the attempts carried from before a requeue, plus the runs the
// store holds, plus this one. Only messages SQS received before are
// looked up. While the store cannot be read, a message counts its
// receives less one (at least its carried attempts plus one): a crash may
// then be charged to a message that did not run, but one receive fewer
// than without a store, so that the subscriber, which trusts a recorded
// count to the attempt limit, still gives a message whose count crashes
// used up one run.
func (s *subscriptionDriver) resolveRuns(ctx context.Context, ms []*driver.Message) {
	marks := make([]*driverkit.StartMark, len(ms))
	for i, m := range ms {
		marks[i] = m.AckID.(*delivery).mark
	}
	if err := s.starts.Resolve(context.WithoutCancel(ctx), marks); err != nil {
		s.log.Warn("keyorder sqs: reading the start store failed; attempts are counted from receives",
			"queue", s.queueURL, "count", len(ms), "err", err)
	}
	for _, m := range ms {
		d := m.AckID.(*delivery)
		switch {
		case d.mark.Earlier <= 0:
			// First receive: nothing recorded; Attempt is prior+1.
		case d.mark.Failed():
			m.Attempt = max(m.Attempt-1, d.prior+1)
		default:
			m.Attempt = d.prior + d.mark.Runs() + 1
		}
		if d.mark.Earlier > 0 {
			s.log.Debug("keyorder sqs: received again", "queue", s.queueURL, "id", m.ID,
				"earlier_receives", d.mark.Earlier, "recorded_runs", d.mark.Runs(), "suspect", d.mark.Suspect(),
				"store_failed", d.mark.Failed(), "attempt", m.Attempt)
		}
	}
}

// flushRuns writes m's unwritten runs before it goes back to SQS, so that
// the next consumer reads them; a failure is logged (m then runs once more
// uncounted at worst).
func (s *subscriptionDriver) flushRuns(ctx context.Context, m *driver.Message) {
	if s.starts == nil {
		return
	}
	d := m.AckID.(*delivery)
	if err := s.starts.Flush(ctx, []*driverkit.StartMark{d.mark}); err != nil {
		s.log.Warn("keyorder sqs: recording a failed message's runs failed; its next delivery may count one attempt fewer",
			"queue", s.queueURL, "id", m.ID, "err", err)
	}
}

// settled tells the start log that ms are deleted from the queue.
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
