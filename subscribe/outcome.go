package subscribe

// This file: running the handler for one item and what its result means
// (ack, retry, dead letter).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/lanes"
)

// handle runs one item on a lane and turns the handler's result into the
// item's fate.
func (s *Subscriber) handle(ctx context.Context, h HandlerFunc, it *item) lanes.Result {
	m := it.m
	if it.parked {
		s.unpark(it)
	}
	if it.lost.Load() {
		s.drop(it)
		return lanes.Done()
	}
	if s.acked.has(m.ID) {
		// A redelivery of a message this process acknowledged, received
		// before (or while) the original ran.
		s.stats.Suppressed.Add(1)
		s.acks <- it
		return lanes.Done()
	}
	if it.chain != nil && it.chain.broken.Load() && !it.called {
		// Not run yet: it goes back unrun. One that ran and waits for
		// its retry in process (HoldChains) keeps its lease and its
		// attempts: handing it back would lose the attempts run in
		// process, and with lane keys the member whose loss broke the
		// chain may be in another lane.
		s.settle(it, func(ctx context.Context) error { return s.drv.Release(ctx, []*driver.Message{m}) })
		return lanes.Done()
	}
	if dn, ok := s.undeadNote(m); ok {
		// A redelivery of a message this process dead-lettered: its fate
		// is decided.
		s.redeliveredDead(it, dn)
		return lanes.Done()
	}
	if it.attempt > s.cfg.Retry.MaxAttempts {
		// Lost leases used up the budget before a handler could finish.
		s.deadLetter(it, fmt.Sprintf("attempts exhausted (%d) by lost leases", it.attempt-1))
		return lanes.Done()
	}
	if r, wait := s.throttle(it); wait {
		return r
	}
	s.started(ctx, it)
	// The attempt's context, cancelled when it ends or its lease is lost
	// (see attemptCtx); the first attempt's comes with the item.
	hctx := &it.actx
	if hctx.parent != nil {
		hctx = new(attemptCtx)
	}
	hctx.parent = ctx
	it.mu.Lock()
	it.hctx = hctx
	it.mu.Unlock()
	if it.lost.Load() {
		hctx.cancel()
	}
	end, err := s.call(hctx, h, it)
	it.mu.Lock()
	it.hctx = nil
	it.mu.Unlock()
	hctx.cancel()
	s.stats.Handled.Add(1)

	if err == nil {
		observed(end, OutcomeAck, nil)
		s.acked.add(m.ID)
		s.stats.Acked.Add(1)
		s.acks <- it
		return lanes.Done()
	}
	if it.lost.Load() {
		observed(end, OutcomeLeaseLost, err)
		s.drop(it) // the broker took it back; it counted the attempt
		return lanes.Done()
	}
	if s.closing.Load() && ctx.Err() != nil {
		// Cancelled by shutdown: not the message's fault.
		observed(end, OutcomeReleased, err)
		if it.chain != nil {
			it.chain.broken.Store(true)
		}
		s.settle(it, func(ctx context.Context) error { return s.drv.Release(ctx, []*driver.Message{m}) })
		return lanes.Done()
	}
	var perm *keyorder.PermanentError
	if errors.As(err, &perm) {
		observed(end, OutcomeDeadLetter, err)
		s.deadLetter(it, err.Error())
		return lanes.Done()
	}
	if it.attempt >= s.cfg.Retry.MaxAttempts {
		observed(end, OutcomeDeadLetter, err)
		s.deadLetter(it, fmt.Sprintf("max attempts (%d) reached: %v", s.cfg.Retry.MaxAttempts, err))
		return lanes.Done()
	}
	delay := s.cfg.Retry.Backoff(it.attempt)
	var re *keyorder.RetryError
	if errors.As(err, &re) {
		delay = re.After
	}
	observed(end, OutcomeRetry, err)
	s.stats.Retried.Add(1)
	s.cfg.Logger.Debug("keyorder: handler failed; retrying", "id", m.ID, "key", m.Key, "attempt", it.attempt, "delay", delay, "err", err)
	if s.caps.NativeHold && !s.holdsChain(it) {
		if it.chain != nil {
			it.chain.broken.Store(true)
		}
		s.settle(it, func(ctx context.Context) error { return s.drv.Nack(ctx, m, delay) })
		return lanes.Done()
	}
	// Hold in process (no native hold, or the rest of its chain behind it
	// under HoldChains): the item stays in its lane, its key parked, its
	// lease kept alive; its flow-control token is returned so other keys
	// keep flowing.
	it.attempt++
	s.park(it)
	return lanes.RetryAt(time.Now().Add(delay))
}

func (s *Subscriber) deadLetter(it *item, reason string) {
	s.stats.DeadLettered.Add(1)
	s.cfg.Logger.Warn("keyorder: message dead-lettered", "id", it.m.ID, "key", it.m.Key, "attempts", it.attempt, "reason", reason)
	s.deadLetterAs(it, reason, it.attempt)
}

// deadLetterAs hands it to the driver's DeadLetter, and remembers the
// message's fate for a redelivery of the same copy (undeadNote): if the
// call was given up, the redelivery is dead-lettered again rather than
// run; if it landed, the redelivery is acknowledged without running. A
// broker that streams a key redelivers a dead-lettered message with the
// key's later messages when an earlier one's lease runs out (Pub/Sub
// redelivers acknowledged messages too), and running it again would run it
// after messages of its key that ran after it was dead-lettered.
func (s *Subscriber) deadLetterAs(it *item, reason string, attempts int) {
	err := s.settle(it, func(ctx context.Context) error { return s.drv.DeadLetter(ctx, it.m, reason, attempts) })
	s.undead.put(it.m.ID, deadNote{reason: reason, attempts: attempts, copy: it.m.Copy, attempt: it.m.Attempt, landed: err == nil})
}

// redeliveredDead settles a redelivery of a message this process
// dead-lettered (undeadNote): again by DeadLetter if the first call did not
// land, else acknowledged, as a redelivery of an acknowledged message is.
func (s *Subscriber) redeliveredDead(it *item, dn deadNote) {
	if !dn.landed {
		s.deadLetterAs(it, dn.reason, dn.attempts)
		return
	}
	s.stats.Suppressed.Add(1)
	s.acks <- it
}

// deadNote is a dead letter's reason and attempts, kept for its
// redelivery, the delivery the call was made on (its copy and the broker's
// attempt; see undeadNote), and whether the call landed.
type deadNote struct {
	reason   string
	attempts int
	copy     any
	attempt  int
	landed   bool
}

// call runs the handler, turning a panic into an error. end ends the
// attempt's observation (Config.Observer); nil without an observer.
func (s *Subscriber) call(ctx context.Context, h HandlerFunc, it *item) (end func(Outcome, error), err error) {
	m := it.m
	d := s.delivery(it)
	if s.cfg.Observer != nil {
		ctx, end = s.cfg.Observer.StartProcess(ctx, d)
	}
	defer func() {
		if r := recover(); r != nil {
			s.stats.Panics.Add(1)
			err = &keyorder.PanicError{Value: r, Stack: debug.Stack()}
			s.cfg.Logger.Error("keyorder: handler panicked", "id", m.ID, "key", m.Key, "panic", r)
		}
	}()
	return end, h(ctx, d)
}

// delivery returns the Delivery an attempt of it is handed.
func (s *Subscriber) delivery(it *item) *keyorder.Delivery {
	m := it.m
	headers := make(map[string]string, len(m.Headers)+1)
	for k, v := range m.Headers {
		headers[k] = v
	}
	if m.Key != "" {
		headers[keyorder.HeaderPartitionKey] = m.Key
	}
	payload := m.Payload
	if !s.caps.NativeHold || s.batcher != nil {
		// The message may be handed to a handler again (a retry held in
		// process; the rest of a batch, handed again after one of its
		// messages settled): each attempt gets its own copy, so what a
		// handler writes into it never reaches a later attempt. Otherwise
		// the driver's bytes are this delivery's own already.
		payload = bytes.Clone(payload)
	}
	d := &it.d
	if it.called {
		d = new(keyorder.Delivery)
	}
	it.called = true
	*d = keyorder.Delivery{
		Message: keyorder.Message{
			ID: m.ID, Key: m.Key, Payload: payload, Headers: headers, NotBefore: m.NotBefore,
		},
		Attempt:      it.attempt,
		PublishTime:  m.PublishTime,
		Subscription: s.name,
	}
	return d
}
