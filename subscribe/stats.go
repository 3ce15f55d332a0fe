package subscribe

// This file: the one way to read a subscriber's counts (Stats) and the keys
// its backend holds (HeldKeys).

import (
	"context"
	"fmt"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
)

// Stats are a Subscriber's counts: what this process did since New, and,
// when the backend reports them, the subscription's counts as the broker
// keeps them.
type Stats struct {
	// Handled counts handler calls; under RunBatch, messages handed to
	// the batch handler.
	Handled int64
	// Acked counts messages acknowledged.
	Acked int64
	// Retried counts failed attempts that will be retried.
	Retried int64
	// DeadLettered counts messages dead-lettered by this process.
	DeadLettered int64
	// Suppressed counts redeliveries of message IDs this process had
	// already acknowledged (not handled again).
	Suppressed int64
	// LeasesLost counts messages whose lease was lost while held.
	LeasesLost int64
	// Panics counts handler panics (each also counts as a failed attempt).
	Panics int64
	// SettleRetries counts settlement calls (Ack, Nack, Release,
	// DeadLetter, ExtendLeases) repeated after a retryable failure.
	SettleRetries int64
	// SettleFailures counts settlements given up (a permanent error, or
	// retries exhausted): the broker redelivers those messages when their
	// leases expire.
	SettleFailures int64
	// Throttled counts the times a message waited for a throttle's token
	// (Config.Throttles) instead of running; not attempts.
	Throttled int64
	// Outstanding is how many received messages are not settled yet.
	Outstanding int
	// Held is how many of those are held in process outside
	// Config.MaxOutstanding: waiting on a time, or behind their key's
	// held head (see Config.MaxHeld).
	Held int
	// Backend holds the subscription's counts as the backend reports them
	// (PostgreSQL counts pending messages, dead letters, held keys and,
	// for a compacting subscription, superseded messages;
	// a count a backend cannot report is keyorder.Unknown). It is nil when
	// the backend reports none.
	Backend *keyorder.BackendStats
}

// Stats returns the subscriber's counts. The process's own counts are
// always there; asking the backend for its counts (Stats.Backend) is a
// query to the broker, for monitoring and tests rather than a hot path. An
// error from the backend is returned with the process's counts.
func (s *Subscriber) Stats(ctx context.Context) (Stats, error) {
	c := &s.stats
	st := Stats{
		Handled: c.Handled.Load(), Acked: c.Acked.Load(), Retried: c.Retried.Load(),
		DeadLettered: c.DeadLettered.Load(), Suppressed: c.Suppressed.Load(),
		LeasesLost: c.LeasesLost.Load(), Panics: c.Panics.Load(),
		SettleRetries: c.SettleRetries.Load(), SettleFailures: c.SettleFailures.Load(),
		Throttled: c.Throttled.Load(),
	}
	s.mu.Lock()
	st.Outstanding, st.Held = s.outstanding.n, s.held
	s.mu.Unlock()
	r, ok := s.drv.(driver.StatsReporter)
	if !ok {
		return st, nil
	}
	bs, err := r.BackendStats(ctx)
	if err != nil {
		return st, driver.WrapError("stats", err, s.drv.ErrorCode)
	}
	st.Backend = &bs
	return st, nil
}

// HeldKeys lists up to limit ordering keys the backend holds (in flight, or
// waiting for a retry or a not-before time), soonest deliverable first;
// limit <= 0 lists them all. It fails with keyorder.ErrUnsupported where the
// backend cannot list them: SQS hides a held group's messages, and Pub/Sub
// and Pulsar hold keys inside the consuming process.
func (s *Subscriber) HeldKeys(ctx context.Context, limit int) ([]keyorder.HeldKey, error) {
	l, ok := s.drv.(driver.HeldKeyLister)
	if !ok {
		return nil, fmt.Errorf("held keys: %w", keyorder.ErrUnsupported)
	}
	keys, err := l.HeldKeys(ctx, limit)
	if err != nil {
		return nil, driver.WrapError("held keys", err, s.drv.ErrorCode)
	}
	return keys, nil
}
