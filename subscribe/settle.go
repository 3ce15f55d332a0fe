package subscribe

// This file: settlement, the batching acker, and the bounded retries of
// Ack, Nack, Release and DeadLetter.

import (
	"context"
	"slices"
	"time"

	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// ackBatchMax is the most acknowledgements sent in one driver call.
const ackBatchMax = 256

// Each Ack call gets at least ackTimeout; one context serves the calls of
// ackCtxReuse, so a busy acker does not allocate a timer per call.
const (
	ackTimeout  = 30 * time.Second
	ackCtxReuse = 5 * time.Second
)

// acker sends acknowledgements in batches: it takes what has queued up
// while the previous call ran, so an idle subscriber acks at once and a busy
// one makes one round trip for many messages.
func (s *Subscriber) acker(done chan<- struct{}) {
	defer close(done)
	var spare []*item
	ms := make([]*driver.Message, 0, ackBatchMax)
	var actx timeoutCtx
	defer actx.stop()
	for {
		all, ok := s.acks.take(spare)
		if !ok {
			return
		}
		for rest := all; len(rest) > 0; {
			batch := rest[:min(len(rest), ackBatchMax)]
			rest = rest[len(batch):]
			s.ack(actx.get(), batch, ms[:0])
		}
		clear(all)
		spare = all[:0]
	}
}

// ack acknowledges batch in one driver call (ms is scratch space).
func (s *Subscriber) ack(ctx context.Context, batch []*item, ms []*driver.Message) {
	s.mu.Lock() // out of outstanding: a renewal now does not call them lost
	for _, it := range batch {
		s.removeOutstanding(it)
		if it.fenced.Load() {
			// Revoked (see revoke.go) since it was queued: not ours to
			// settle.
			continue
		}
		ms = append(ms, it.m)
	}
	s.mu.Unlock()
	defer clear(ms)
	if len(ms) == 0 {
		s.forgetAll(batch)
		return
	}
	if err := s.drv.Ack(ctx, ms); err != nil {
		s.unacked(ms)
		if s.drv.IsRetryable(err) {
			// Retried off the acker, so the acknowledgements queued
			// behind this batch are not held up by it.
			s.stats.SettleRetries.Add(1)
			s.settling.Add(1)
			go s.retryAck(slices.Clone(batch), slices.Clone(ms), err)
			return
		}
		s.stats.SettleFailures.Add(1)
		s.cfg.Logger.Warn("keyorder: acknowledging messages failed; the broker may redeliver them", "count", len(ms), "err", err)
	}
	s.forgetAll(batch)
}

// unacked remembers the IDs of messages whose Ack failed over a driver
// whose acknowledgements are final (driver.FinalAcker), which remembers no
// other: the broker may redeliver them, and they ran.
func (s *Subscriber) unacked(ms []*driver.Message) {
	if !s.acksFinal {
		return
	}
	for _, m := range ms {
		s.acked.add(m.ID)
	}
}

// retryAck retries an acknowledgement that failed with a retryable error,
// with backoff, then forgets the batch's items whatever the outcome: an
// acknowledgement that never lands leaves the messages to the broker's
// redelivery, which the acknowledged-ID set suppresses.
func (s *Subscriber) retryAck(batch []*item, ms []*driver.Message, err error) {
	defer s.settling.Done()
	ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
	defer cancel()
	if err := s.backoffRetry(ctx, 1, err, func(ctx context.Context) error { return s.drv.Ack(ctx, ms) }); err != nil {
		s.stats.SettleFailures.Add(1)
		s.cfg.Logger.Warn("keyorder: acknowledging messages failed after retries; the broker may redeliver them", "count", len(ms), "err", err)
	}
	s.forgetAll(batch)
}

// Settlement retries: a call failing with an error the driver calls
// retryable is repeated with backoff (settleBackoff, from settleMinBackoff
// doubling up to settleMaxBackoff), at most settleTries calls in all and
// within the call's context (ackTimeout), then given up and logged.
const (
	settleTries      = 8
	settleMinBackoff = 50 * time.Millisecond
	settleMaxBackoff = 5 * time.Second
)

var settleBackoff = policy.Retry{MinBackoff: settleMinBackoff, MaxBackoff: settleMaxBackoff}

// retrySettle runs a settlement call, repeating it while it fails with a
// retryable error, up to the bounds above. It returns the last error.
func (s *Subscriber) retrySettle(ctx context.Context, call func(ctx context.Context) error) error {
	err := call(ctx)
	if err == nil || !s.drv.IsRetryable(err) {
		return err
	}
	s.stats.SettleRetries.Add(1)
	return s.backoffRetry(ctx, 1, err, call)
}

// backoffRetry repeats a call that has failed retryably failed times, the
// last time with err, waiting settleBackoff before each try.
func (s *Subscriber) backoffRetry(ctx context.Context, failed int, err error, call func(ctx context.Context) error) error {
	for ; failed < settleTries; failed++ {
		t := time.NewTimer(settleBackoff.Backoff(failed))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		if err = call(ctx); err == nil || !s.drv.IsRetryable(err) {
			return err
		}
		if failed+1 < settleTries {
			s.stats.SettleRetries.Add(1)
		}
	}
	return err
}

// timeoutCtx hands out a context with at least ackTimeout left, making a new
// one only when the current one has less.
type timeoutCtx struct {
	ctx      context.Context
	cancel   context.CancelFunc
	deadline time.Time
}

func (t *timeoutCtx) get() context.Context {
	if t.ctx == nil || time.Until(t.deadline) < ackTimeout {
		t.stop()
		t.deadline = time.Now().Add(ackTimeout + ackCtxReuse)
		t.ctx, t.cancel = context.WithDeadline(context.Background(), t.deadline)
	}
	return t.ctx
}

func (t *timeoutCtx) stop() {
	if t.cancel != nil {
		t.cancel()
	}
}

// settle runs a driver call that finishes an item, retrying it while it
// fails retryably (retrySettle), and logs a failure it gives up on. It runs
// on the item's lane, so the lane moves on to the key's next message only
// after the broker has the settlement (or it was given up and the broker
// will redeliver the message when its lease expires).
func (s *Subscriber) settle(it *item, call func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
	defer cancel()
	s.detach(it)
	err := s.retrySettle(ctx, call)
	if err != nil {
		s.stats.SettleFailures.Add(1)
		s.cfg.Logger.Warn("keyorder: settling message failed; the broker will redeliver it", "id", it.m.ID, "key", it.m.Key, "err", err)
	}
	s.forget(it)
	return err
}
