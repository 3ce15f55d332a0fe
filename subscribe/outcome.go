package subscribe

// This file: running a lane item's handler (a message under Run, a batch
// under RunBatch) and what its result means for each message (ack, retry,
// dead letter).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/lanes"
	"github.com/keyorder/keyorder/policy"
)

// Running a lane item and deciding what becomes of its messages is one
// path for Run and RunBatch: a message under Run is a batch of one. The
// path is execute, then one decision, as River's executor runs a job and
// reports its result:
//
//   - prepare sorts the members before a run (lost, acknowledged, chain
//     broken, dead-lettered before, attempts used up) and starts the
//     attempt (throttles, Started, its context);
//   - call or callBatch runs the handler;
//   - endAttempt ends the attempt's context;
//   - decide settles each member by the result: those before the failed
//     index acknowledged, the failed one by its error (lost lease, shutdown,
//     Permanent or out of attempts, backoff or RetryAfter), those behind it
//     by what the failed one's fate leaves them.

// handle runs one message on a lane under Run: a batch of one.
func (s *Subscriber) handle(ctx context.Context, h HandlerFunc, it *item) lanes.Result {
	one := [1]*item{it}
	run, hctx, r, ok := s.prepare(ctx, one[:])
	if !ok {
		return r
	}
	defer s.revokeSettled(run)
	end, err := s.call(hctx, h, it)
	cut := s.endAttempt(ctx, hctx, run)
	if s.abandoned.Load() {
		// Run returned without waiting for it (Close's deadline).
		s.abandonedReturned(run)
		return lanes.Done()
	}
	ends := [1]func(Outcome, error){end}
	_, r = s.decide(ctx, run, ends[:], 0, err, cut)
	return r
}

// prepare sorts the members of a lane item (its, in their key's order)
// before a run and starts the attempt of those that run. It settles those
// that must not run (acknowledged before, dead-lettered before, attempts
// used up by lost leases); a lost member, or one whose chain broke before
// it ran, goes back with every member behind it, since nothing behind it
// may run before the broker redelivers it. It returns the members that
// run, in order, filtered in place in its, and their attempt's context;
// ok false means nothing runs now and r is the lane's result: Done when
// no member is left, a wait when a throttle holds them (run then lists
// them all).
func (s *Subscriber) prepare(ctx context.Context, its []*item) (run []*item, hctx *attemptCtx, r lanes.Result, ok bool) {
	run = its[:0]
	for k, it := range its {
		if it.parked {
			s.unpark(it)
		}
		if it.lost.Load() {
			// The broker redelivers it.
			s.cut(its[k:])
			break
		}
		if aside, back := s.behindBarrier(it); aside {
			// Its key waits for a lost message's redelivery: aside, or
			// back to the broker behind a dead letter that did not land.
			s.cutBack(back)
			continue
		} else if len(back) > 0 {
			// It is that redelivery: what waited goes back behind it.
			s.cut(back)
		}
		if s.acked.has(it.m.ID) {
			// A redelivery of a message this process acknowledged,
			// received before (or while) the original ran.
			s.stats.Suppressed.Add(1)
			s.acks.push(it)
			continue
		}
		if it.chain != nil && it.chain.broken.Load() && !it.called {
			// Not run yet: it goes back unrun. One that ran and waits for
			// its retry in process (HoldChains) keeps its lease and its
			// attempts: handing it back would lose the attempts run in
			// process, and with lane keys the member whose loss broke the
			// chain may be in another lane.
			s.cut(its[k:])
			break
		}
		if dn, ok := s.undeadNote(it.m); ok {
			// A redelivery of a message this process dead-lettered: its
			// fate is decided.
			s.redeliveredDead(it, dn)
			continue
		}
		if it.attempt > s.unrunLimit() {
			// Lost leases used up the budget, and more: see unrunLimit.
			s.deadLetter(it, fmt.Sprintf("attempts exhausted (%d) by lost leases", it.attempt-1))
			continue
		}
		run = append(run, it)
	}
	if len(run) == 0 {
		return run, nil, lanes.Done(), false
	}
	if r, wait := s.throttle(run[0], len(run)); wait {
		// Waits like a retry, intact, counting no attempt.
		return run, nil, r, false
	}
	s.started(ctx, run)
	for k, it := range run {
		if it.lost.Load() {
			// Lost while its start was being recorded: it does not run
			// (with a cancelled context), nor anything behind it.
			s.cfg.Logger.Debug("keyorder: lease lost while the handler start was recorded; not run",
				"id", it.m.ID, "key", it.m.Key, "attempt", it.attempt)
			s.cut(run[k:])
			run = run[:k]
			break
		}
	}
	if len(run) == 0 {
		return run, nil, lanes.Done(), false
	}
	// The attempt's context, cancelled when it ends or a member's lease is
	// lost (see attemptCtx); the first attempt of its first member comes
	// with the item.
	hctx = &run[0].actx
	if hctx.parent != nil {
		hctx = new(attemptCtx)
	}
	hctx.parent = ctx
	hctx.begun = time.Since(s.born)
	// Each member is the attempt's (hctx set) unless it was lost (or
	// revoked: see revoke.go) first, both under its mu: a member lost
	// from now on is running, and its loss cancels hctx.
	for k, it := range run {
		it.mu.Lock()
		if it.lost.Load() {
			it.mu.Unlock()
			s.cfg.Logger.Debug("keyorder: lease lost after the handler start was recorded; not run",
				"id", it.m.ID, "key", it.m.Key, "attempt", it.attempt)
			for _, o := range run[:k] {
				o.mu.Lock()
				o.hctx = nil
				o.mu.Unlock()
			}
			s.cut(run[k:])
			run = run[:k]
			break
		}
		it.hctx = hctx
		it.mu.Unlock()
	}
	if len(run) == 0 {
		return run, nil, lanes.Done(), false
	}
	hctx.begin(s, run)
	return run, hctx, lanes.Result{}, true
}

// endAttempt ends the attempt of run and reports whether a member's lost
// lease cancelled it while the lane's ctx was not done (keepLeases cancels
// the whole attempt).
func (s *Subscriber) endAttempt(ctx context.Context, hctx *attemptCtx, run []*item) (leaseCut bool) {
	for _, it := range run {
		it.mu.Lock()
		it.hctx = nil
		it.mu.Unlock()
	}
	// Out of the items, nothing cancels it now but end: whether it was
	// cancelled is settled.
	leaseCut = hctx.end() && ctx.Err() == nil
	s.stats.Handled.Add(int64(len(run)))
	return leaseCut
}

// decide settles the members of run, which ran together (one under Run),
// by the result: cause nil means all succeeded; otherwise run[:i]
// succeeded and run[i] failed with cause. ends[k] ends the observation of
// run[k]'s attempt. leaseCut: a member's lost lease cancelled the attempt
// (endAttempt). It returns the members that stay the lane's item, in
// order, and the lane's result: Done, or when they run again.
func (s *Subscriber) decide(ctx context.Context, run []*item, ends []func(Outcome, error), i int, cause error, leaseCut bool) ([]*item, lanes.Result) {
	if cause == nil {
		i = len(run)
	}
	var now []*item // revoked while running: acknowledged before revoke returns
	for k, it := range run[:i] {
		if it.fenced.Load() {
			// The driver refused its settlement in the handler (the
			// lease was lost): whoever holds it now settles it.
			observed(ends[k], OutcomeLeaseLost, nil)
			s.drop(it)
			continue
		}
		observed(ends[k], OutcomeAck, nil)
		if !s.acksFinal {
			s.acked.add(it.m.ID)
		}
		s.stats.Acked.Add(1)
		if it.revoking.Load() {
			now = append(now, it)
			continue
		}
		s.acks.push(it)
	}
	if len(now) > 0 {
		s.ackNow(now)
	}
	if cause == nil {
		return nil, lanes.Done()
	}
	it, rest := run[i], run[i+1:]
	var revoked []*item
	for _, o := range run[i:] {
		if o.revoking.Load() {
			// Revoked while it ran (see revoke): it does not run here
			// again; the partition's next owner runs it, the driver
			// counting the attempt that started. Under in-process hold
			// its key's later messages that come here wait for its
			// redelivery (a barrier, as for a lost lease).
			o.mu.Lock()
			o.fenced.Store(true)
			o.lost.Store(true)
			o.mu.Unlock()
			revoked = append(revoked, o)
		}
	}
	if len(revoked) > 0 {
		s.mu.Lock()
		s.leaseLost(revoked)
		s.mu.Unlock()
	}
	// outcome ends the observation of the failed member's attempt with o,
	// and of those behind it, which never ran, as released.
	outcome := func(o Outcome) {
		observed(ends[i], o, cause)
		for _, e := range ends[i+1:] {
			observed(e, OutcomeReleased, nil)
		}
	}
	if it.lost.Load() {
		outcome(OutcomeLeaseLost)
		s.drop(it) // the broker took it back; it counted the attempt
		s.cut(rest)
		return nil, lanes.Done()
	}
	if s.closing.Load() && ctx.Err() != nil {
		// Cancelled by shutdown: not the messages' fault. One that failed
		// here before and was cut short in its in-process retry keeps the
		// attempts it used (giveBackAtStop), as it would waiting for it.
		outcome(OutcomeReleased)
		s.cutAtStop(run[i:])
		return nil, lanes.Done()
	}
	var perm *keyorder.PermanentError
	permanent := errors.As(cause, &perm)
	if leaseCut && !permanent {
		// Cancelled because a later member's lease was lost (this one's
		// is not): not its fault, so no attempt counts. (A Permanent
		// failure is the handler's decision about this member, made
		// whatever cancelled the attempt: it is dead-lettered below, as
		// under Run, and the lost members behind it are dropped when the
		// rest runs.) The members
		// before the first lost one still hold their leases: they run
		// again in process, first, keeping their place at the head of the
		// key (WaitAt), since the broker redelivers the lost one (and,
		// where it streams a key, those after it) and none of those may
		// run before them; handing them back instead would put them
		// behind that redelivery. From the first lost member on, the
		// lost are dropped and the others released.
		outcome(OutcomeReleased)
		k := i
		for k < len(run) && !run[k].lost.Load() {
			k++
		}
		s.cut(run[k:])
		if k == i {
			return nil, lanes.Done()
		}
		return run[i:k], lanes.WaitAt(time.Time{})
	}
	dead := ""
	switch {
	case permanent:
		dead = cause.Error()
	case it.attempt >= s.cfg.Retry.MaxAttempts:
		dead = fmt.Sprintf("max attempts (%d) reached: %v", s.cfg.Retry.MaxAttempts, cause)
	}
	if dead != "" {
		outcome(OutcomeDeadLetter)
		if err := s.deadLetter(it, dead); err != nil && s.caps.NativeHold && s.caps.Ordering == policy.Ordered && it.chain != nil {
			// The call may not have landed (the lease was lost, or it
			// was given up): the broker would redeliver the message, and
			// nothing of its chain, leased here, may run before it. The
			// chain breaks and its rest goes back, to come after the
			// redelivery (dead-lettered again: undeadNote). (Under
			// in-process hold deadLetterAs set the key's barrier: the
			// rest goes back as its turn comes, lostkey.go.)
			it.chain.broken.Store(true) // members in other lane items too
			s.cut(rest)
			return nil, lanes.Done()
		}
		if len(rest) == 0 {
			return nil, lanes.Done()
		}
		// The key continues with the message after it, before anything
		// else of the key.
		return rest, lanes.RetryAt(time.Time{})
	}
	delay := s.cfg.Retry.Backoff(it.attempt)
	var re *keyorder.RetryError
	if errors.As(cause, &re) {
		delay = re.After
	}
	outcome(OutcomeRetry)
	s.stats.Retried.Add(1)
	if s.batcher != nil {
		s.cfg.Logger.Debug("keyorder: batch handler failed; retrying", "id", it.m.ID, "key", it.m.Key, "index", i, "attempt", it.attempt, "delay", delay, "err", cause)
	} else {
		s.cfg.Logger.Debug("keyorder: handler failed; retrying", "id", it.m.ID, "key", it.m.Key, "attempt", it.attempt, "delay", delay, "err", cause)
	}
	if s.caps.Ordering != policy.Ordered && len(rest) > 0 {
		// Exclusive (and Parallel): the failed message may be overtaken,
		// but those behind it never ran and go on at once, as a batch of
		// what is left, before anything else of the key (the lane item
		// keeps its place). Only the failed message waits for its retry:
		// Nacked with its delay where the broker holds the key (which it
		// still does while the rest is leased), or as a lane item of its
		// own, due then, where the process holds it.
		if s.caps.NativeHold {
			m := it.m
			s.settle(it, func(ctx context.Context) error { return s.drv.Nack(ctx, m, delay) })
		} else {
			it.attempt++
			at := time.Now().Add(delay)
			it.due = at.Sub(s.born)
			s.park(it)
			s.retryAside(it, at)
		}
		return rest, lanes.RetryAt(time.Time{})
	}
	if s.caps.NativeHold && !s.holdsChain(it) {
		// The broker holds the key: the failed message goes back with its
		// delay, those behind it unhandled (and the rest of its chain,
		// wherever it waits, when its turn comes).
		if it.chain != nil {
			it.chain.broken.Store(true)
		}
		m := it.m
		s.settle(it, func(ctx context.Context) error { return s.drv.Nack(ctx, m, delay) })
		s.cut(rest)
		return nil, lanes.Done()
	}
	// Hold in process (no native hold, or the rest of its chain behind it
	// under HoldChains): the failed message and those behind it stay in
	// the lane, the key parked, its lease kept alive, until the retry
	// time; its flow-control token is returned so other keys keep
	// flowing.
	it.attempt++
	at := time.Now().Add(delay)
	it.due = at.Sub(s.born)
	s.park(it)
	return run[i:], lanes.RetryAt(at)
}

// ackNow acknowledges its on the caller's lane, not through the acker:
// they were revoked while they ran, and revoke returns only once their
// acknowledgements have reached the driver.
func (s *Subscriber) ackNow(its []*item) {
	ms := make([]*driver.Message, 0, len(its))
	s.mu.Lock()
	for _, it := range its {
		s.removeOutstanding(it)
		if !it.fenced.Load() {
			ms = append(ms, it.m)
		}
	}
	s.mu.Unlock()
	if len(ms) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
		defer cancel()
		if err := s.retrySettle(ctx, func(ctx context.Context) error { return s.drv.Ack(ctx, ms) }); err != nil {
			s.unacked(ms)
			s.stats.SettleFailures.Add(1)
			s.cfg.Logger.Warn("keyorder: acknowledging revoked messages failed; the partition's next owner may run them again", "count", len(ms), "err", err)
		}
	}
	s.forgetAll(its)
}

// cut gives back members that must not run now (the first was lost, or
// its chain broken, or the run was cut short): the lost are dropped (the
// broker redelivers them), the others given back (giveBackAtStop: released
// unhandled, or returned with their attempts if they failed here and wait
// for a retry), and their chains broken.
func (s *Subscriber) cut(its []*item) {
	if s.barriers() {
		// Under in-process hold the key's messages ranked after them
		// wait until they come back (lostkey.go).
		s.mu.Lock()
		s.leaseLost(its)
		s.mu.Unlock()
	}
	s.cutBack(its)
}

// cutBack is cut without setting a barrier: for what a barrier gives
// back, gave up on, or held when Run ends.
func (s *Subscriber) cutBack(its []*item) { s.cutAtStop(its) }

// cutAtStop is cut for members a graceful stop cut short, and cutBack's
// body: those that failed here and were retried in process go back with
// their attempts (giveBackAtStop), not released uncounted. (A message a
// barrier put aside may be one: before, it went back through Release,
// and its next run was counted as its first: seed 743 with
// KEYORDER_MODEL_CLASSES=settleLost, TestBarrierGivesBackRetryWithItsAttempts.)
func (s *Subscriber) cutAtStop(its []*item) {
	var back []*item
	for _, it := range its {
		if it.chain != nil {
			it.chain.broken.Store(true)
		}
		if it.lost.Load() {
			s.drop(it)
		} else {
			back = append(back, it)
		}
	}
	s.giveBackAtStop(back)
}

// deadLetter dead-letters it for reason; an error means the call did not
// land (see deadLetterAs).
func (s *Subscriber) deadLetter(it *item, reason string) error {
	s.stats.DeadLettered.Add(1)
	s.cfg.Logger.Warn("keyorder: message dead-lettered", "id", it.m.ID, "key", it.m.Key, "attempts", it.attempt, "reason", reason)
	return s.deadLetterAs(it, reason, it.attempt)
}

// deadLetterAs hands it to the driver's DeadLetter, and remembers the
// message's fate for a redelivery of the same copy (undeadNote): if the
// call was given up, the redelivery is dead-lettered again rather than
// run; if it landed, the redelivery is acknowledged without running. A
// broker that streams a key redelivers a dead-lettered message with the
// key's later messages when an earlier one's lease runs out (Pub/Sub
// redelivers acknowledged messages too), and running it again would run it
// after messages of its key that ran after it was dead-lettered.
func (s *Subscriber) deadLetterAs(it *item, reason string, attempts int) error {
	err := s.settle(it, func(ctx context.Context) error { return s.drv.DeadLetter(ctx, it.m, reason, attempts) })
	s.undead.put(it.m.ID, deadNote{reason: reason, attempts: attempts, copy: it.m.Copy, attempt: it.m.Attempt, landed: err == nil})
	if err != nil {
		// Under in-process hold the key's later messages must not run
		// before the broker shows whether it comes back (lostkey.go).
		s.deadLetterAway(it)
	}
	return err
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
	s.acks.push(it)
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

// unrunLimit is the highest attempt a message may arrive with and still
// run. A message is dead-lettered for its attempts after a run of its own
// has failed (decide); before a run only when its count shows more lost
// deliveries than a crash loop may take. Where the driver records handler
// starts (driver.StartRecorder), a lost delivery counts only when the
// handler started, so a message that arrives past MaxAttempts has run
// MaxAttempts times: it is dead-lettered unrun. Elsewhere a broker may
// count deliveries that never ran (the messages held in a process that
// died, a chain taken whole by a receive), so a message whose count such
// deliveries used up gets one run, at MaxAttempts+1; past that it is
// dead-lettered unrun, which bounds a message that kills every process
// running it to MaxAttempts+1 runs.
func (s *Subscriber) unrunLimit() int {
	if _, ok := s.drv.(driver.StartRecorder); ok {
		return s.cfg.Retry.MaxAttempts
	}
	return s.cfg.Retry.MaxAttempts + 1
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
	// The attempt's own copy of the message's headers; none (nil) when it
	// has none, so a message without headers costs no map. The key is in
	// Message.Key, not in the headers.
	var headers map[string]string
	if len(m.Headers) > 0 {
		headers = maps.Clone(m.Headers)
	}
	payload := m.Payload
	if s.copiesPayload() {
		// The first attempt's copy was made at receive (item.first),
		// with its neighbours' in one allocation.
		if it.first != nil {
			payload, it.first = it.first, nil
		} else {
			payload = bytes.Clone(payload)
		}
	}
	d := &it.d
	if it.called {
		d = new(keyorder.Delivery)
	}
	it.called = true
	it.dp = d
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

// copiesPayload reports whether each attempt gets its own copy of a
// message's payload. The message may be handed to a handler again (a
// retry held in process, on a broker without native hold or a chain
// member under HoldChains; the rest of a batch, handed again after one of
// its messages settled), and what a handler writes into its payload must
// never reach a later attempt. Otherwise the driver's bytes are the
// delivery's own already.
func (s *Subscriber) copiesPayload() bool {
	return !s.caps.NativeHold || s.caps.HoldChains || s.batcher != nil
}

// payloadChunk is how many bytes of first attempts' payload copies one
// allocation holds (Subscriber.payloads). Small payloads (up to a quarter
// of it) share chunks, so copying one seldom allocates; a chunk lives
// until no delivery cut from it is referenced.
const payloadChunk = 4096
