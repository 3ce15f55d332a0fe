package subscribe

// This file: ordered batches (RunBatch): grouping received messages of one
// key into batches (the batcher), and what a batch handler's result means
// for each message of the batch.

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/lanes"
)

// BatchHandlerFunc handles a batch: up to BatchConfig.MaxSize consecutive
// messages of one ordering key, in their order (a keyless message comes in
// a batch of its own). nil acknowledges them all. An error made with
// keyorder.FailedAt(i, err) says that ds[:i] succeeded and ds[i] failed
// with err; any other error fails the batch at index 0, and so does a
// *keyorder.BatchError whose Index is outside ds (its error then wraps
// ErrBatchIndex and the BatchError's Err). The messages after i never ran:
// they run next, before anything else of their key (under Exclusive and
// Parallel at once, while only ds[i] waits for its retry; under Ordered
// after ds[i]). See the package documentation's Batches section. ds and
// its Deliveries are the handler's to keep.
type BatchHandlerFunc func(ctx context.Context, ds []*keyorder.Delivery) error

// Defaults for BatchConfig.
const (
	BatchMaxSizeDefault = 10
	BatchMaxWaitDefault = 20 * time.Millisecond
	// BatchMaxSizeLimit is the largest BatchConfig.MaxSize.
	BatchMaxSizeLimit = 10000
)

// BatchConfig configures RunBatch. A nil *BatchConfig means the defaults.
type BatchConfig struct {
	// MaxSize is the most messages in one batch. Defaults to
	// BatchMaxSizeDefault; at most BatchMaxSizeLimit. A batch can be no
	// larger than Config.MaxOutstanding, and where the broker holds keys
	// natively (PostgreSQL, SQS) no larger than what one receive returns
	// of a key (PostgreSQL's chain length, 10 on SQS).
	MaxSize int
	// MaxWait is how long a batch that is not full waits, from the receipt
	// of its first message, for more of its key before it is handed to the
	// handler anyway. Defaults to BatchMaxWaitDefault. Where the broker
	// holds keys natively a batch never waits: nothing more of its key can
	// arrive while it is leased.
	MaxWait time.Duration
}

// WithDefaults returns a copy of c (which may be nil) with defaults applied.
func (c *BatchConfig) WithDefaults() *BatchConfig {
	out := &BatchConfig{}
	if c != nil {
		*out = *c
	}
	if out.MaxSize == 0 {
		out.MaxSize = BatchMaxSizeDefault
	}
	if out.MaxWait == 0 {
		out.MaxWait = BatchMaxWaitDefault
	}
	return out
}

func (c *BatchConfig) validate() error {
	switch {
	case c.MaxSize < 0 || c.MaxSize > BatchMaxSizeLimit:
		return fmt.Errorf("%w: subscribe.BatchConfig.MaxSize must be in [1, %d], got %d", keyorder.ErrInvalidConfig, BatchMaxSizeLimit, c.MaxSize)
	case c.MaxWait < 0:
		return fmt.Errorf("%w: subscribe.BatchConfig.MaxWait must not be negative, got %v", keyorder.ErrInvalidConfig, c.MaxWait)
	}
	return nil
}

// RunBatch is Run with a batch handler: it receives and handles messages in
// batches of one key (Config.Batch) until ctx ends or Close is called, then
// shuts down as Run does. Config.Middleware, which wraps a per-message
// HandlerFunc, does not apply. When Config.MaxOutstanding is zero it
// defaults to 2×Workers×Batch.MaxSize here, so batches can fill. Run and
// RunBatch may be called once between them, and not after Close.
func (s *Subscriber) RunBatch(ctx context.Context, h BatchHandlerFunc) error {
	if h == nil {
		return fmt.Errorf("%w: nil batch handler", keyorder.ErrInvalidConfig)
	}
	if err := s.begin(); err != nil {
		return err
	}
	if !s.outstandingAsked {
		n := 2 * s.cfg.Workers * s.cfg.Batch.MaxSize
		s.cfg.MaxOutstanding = n
		s.tokens = newTokens(n)
	} else if s.cfg.MaxOutstanding < s.cfg.Batch.MaxSize {
		s.cfg.Logger.Warn("keyorder: subscribe.Config.MaxOutstanding is below Batch.MaxSize; batches cannot fill and wait MaxWait",
			"max_outstanding", s.cfg.MaxOutstanding, "max_size", s.cfg.Batch.MaxSize)
	}
	pool, err := lanes.New(s.lanesConfig(), func(ctx context.Context, key string, keyed bool, b *batch) lanes.Result {
		return s.handleBatch(ctx, h, b)
	})
	if err != nil {
		return err
	}
	return s.run(ctx, nil, pool)
}

// batch is the lane item under RunBatch: consecutive messages of one lane
// key, handed to the batch handler together.
type batch struct {
	// key is the members' lane key (item.key), fair the first member's
	// fairness key.
	key, fair string
	// its lists the members not yet settled, in order: after a partial
	// failure the batch stays the lane's item with the failed message and
	// those behind it.
	its []*item
	// due is when an open batch is handed to the lanes.
	due time.Time
}

// unbatch returns the members bs have not settled, in order, and empties
// bs.
func unbatch(bs []*batch) []*item {
	var out []*item
	for _, b := range bs {
		out = append(out, b.its...)
		b.its = nil
	}
	return out
}

// batcher groups received messages into batches, one open batch per key,
// and submits a batch to the lanes when it is full or its MaxWait has
// passed. Every submission is made under mu, so a key's batches reach the
// lanes in their order.
type batcher struct {
	s    *Subscriber
	pool *lanes.Pool[*batch]
	ctx  context.Context
	size int
	wait time.Duration

	mu sync.Mutex
	// open is the open batch of each lane key (item.key, the broker's key
	// refined by Config.LaneKey).
	open    map[string]*batch
	queue   []*batch // open batches by due time; stale entries skipped
	stopped bool

	wake chan struct{}
	quit chan struct{}
	done chan struct{}
}

func newBatcher(s *Subscriber, pool *lanes.Pool[*batch], ctx context.Context) *batcher {
	b := &batcher{
		s: s, pool: pool, ctx: ctx,
		size: s.cfg.Batch.MaxSize, wait: s.cfg.Batch.MaxWait,
		open: map[string]*batch{},
		wake: make(chan struct{}, 1),
		quit: make(chan struct{}),
		done: make(chan struct{}),
	}
	go b.loop()
	return b
}

// ErrBatchIndex is wrapped in the error a batch's first message fails with
// when the batch handler returned a *keyorder.BatchError whose Index is
// outside the batch (negative, or not below the batch's length): the batch
// fails at index 0, and the error also wraps the BatchError's Err, whose
// meaning (RetryAfter, Permanent) still applies.
var ErrBatchIndex = errors.New("subscribe: batch handler reported a failure at an index outside the batch")

// errBatcherStopped: the batcher no longer submits; what it was given went
// back to the broker.
var errBatcherStopped = errors.New("subscribe: batcher stopped")

// add puts a received item in its key's open batch, submitting the batch
// when full. A keyless item, or one not due yet (a not-before time), is a
// batch of its own, submitted at once after its key's open batch. On an
// error the item and its batch have been given back to the broker.
func (b *batcher) add(ctx context.Context, it *item) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		b.s.giveBack([]*item{it})
		return errBatcherStopped
	}
	key := it.key
	if key == "" || it.m.NotBefore.After(time.Now()) {
		if o := b.open[key]; o != nil && key != "" {
			delete(b.open, key)
			if err := b.submit(ctx, o); err != nil {
				b.s.giveBack([]*item{it})
				return err
			}
		}
		return b.submit(ctx, &batch{key: key, fair: it.fair, its: []*item{it}})
	}
	o := b.open[key]
	if o == nil {
		o = &batch{key: key, fair: it.fair, its: append(make([]*item, 0, min(b.size, 16)), it)}
		if b.size > 1 {
			o.due = time.Now().Add(b.wait)
			b.open[key] = o
			b.queue = append(b.queue, o)
			select {
			case b.wake <- struct{}{}:
			default:
			}
			return nil
		}
		return b.submit(ctx, o)
	}
	o.its = append(o.its, it)
	if len(o.its) >= b.size {
		delete(b.open, key)
		return b.submit(ctx, o)
	}
	return nil
}

// submit hands a batch to the lanes. Called with b.mu held. On failure (the
// subscriber is stopping) the batch is given back and the batcher stops.
func (b *batcher) submit(ctx context.Context, o *batch) error {
	if err := b.pool.Submit(ctx, lanes.Item{Key: o.key, Keyed: o.key != "", NotBefore: o.its[0].m.NotBefore, Fairness: o.fair}, o); err != nil {
		b.stopped = true
		b.s.giveBack(unbatch([]*batch{o}))
		return err
	}
	return nil
}

// flushAll submits every open batch, oldest first.
func (b *batcher) flushAll(ctx context.Context) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, o := range b.queue {
		if b.stopped {
			break
		}
		if b.open[o.key] == o {
			delete(b.open, o.key)
			b.submit(ctx, o)
		}
	}
	clear(b.queue)
	b.queue = b.queue[:0]
}

// loop submits open batches whose MaxWait has passed.
func (b *batcher) loop() {
	defer close(b.done)
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	for {
		b.mu.Lock()
		now := time.Now()
		var next time.Time
		for len(b.queue) > 0 && !b.stopped {
			o := b.queue[0]
			if b.open[o.key] != o {
				b.queue[0] = nil
				b.queue = b.queue[1:]
				continue
			}
			if o.due.After(now) {
				next = o.due
				break
			}
			b.queue[0] = nil
			b.queue = b.queue[1:]
			delete(b.open, o.key)
			b.submit(b.ctx, o)
		}
		b.mu.Unlock()
		if !next.IsZero() {
			t.Reset(time.Until(next))
		}
		select {
		case <-b.quit:
			return
		case <-b.wake:
		case <-t.C:
		}
	}
}

// stop ends the batcher and returns the members of its open batches, never
// started, for Run to give back after what the lanes held: on a broker that
// redelivers in the order messages are given back (the Pub/Sub emulator),
// a key's older messages must go back first.
func (b *batcher) stop() []*item {
	b.mu.Lock()
	b.stopped = true
	var its []*item
	for _, o := range b.queue {
		if b.open[o.key] == o {
			its = append(its, unbatch([]*batch{o})...)
		}
	}
	clear(b.open)
	b.queue = nil
	b.mu.Unlock()
	close(b.quit)
	<-b.done
	return its
}

// handleBatch runs one batch on a lane under RunBatch and turns the batch
// handler's result into each member's fate (prepare, decide): those
// before the failed index are acknowledged, the failed one gets its
// error's outcome, as a message under Run would, and those after it run
// next or return to pending in their order. The members that stay the
// lane's item remain in c.
func (s *Subscriber) handleBatch(ctx context.Context, h BatchHandlerFunc, c *batch) lanes.Result {
	run, hctx, r, ok := s.prepare(ctx, c.its)
	c.its = run
	if !ok {
		return r
	}
	defer s.revokeSettled(run)
	ends, err := s.callBatch(hctx, h, run)
	cut := s.endAttempt(ctx, hctx, run)
	if s.abandoned.Load() {
		// Run returned without waiting for it (Close's deadline).
		s.abandonedReturned(run)
		c.its = nil
		return lanes.Done()
	}
	i, cause := len(run), error(nil)
	if err != nil {
		i, cause = s.batchFailure(err, run)
	}
	c.its, r = s.decide(ctx, run, ends, i, cause, cut)
	return r
}

// retryAside makes it, a failed member of a batch under Exclusive or
// Parallel with in-process hold, a batch of its own (a new carrier) due at
// at, while the rest of its batch goes on: later messages of its key may
// run first, as they may overtake a failed single message. The Submit runs
// off the lane, since it may wait for room that only the lane's workers
// make; if the pool has closed meanwhile, it goes back to the broker as
// the pool's leftovers do (Run waits for it through settling).
func (s *Subscriber) retryAside(it *item, at time.Time) {
	c := &batch{key: it.key, fair: it.fair, its: []*item{it}}
	s.settling.Add(1)
	go func() {
		defer s.settling.Done()
		if err := s.batcher.pool.Submit(context.Background(), lanes.Item{Key: c.key, Keyed: c.key != "", NotBefore: at, Fairness: c.fair}, c); err != nil {
			// The lanes are closed (Run stops): it goes back with the
			// attempt it used here (giveBackAtStop).
			s.giveBackAtStop([]*item{it})
		}
	}()
}

// batchFailure is keyorder.BatchFailure made safe for any error a batch
// handler returns over run: where the batch failed and the failed
// message's error. A *keyorder.BatchError whose Index is outside run
// fails the batch at index 0 with ErrBatchIndex, wrapping the BatchError's
// Err (so a RetryAfter or Permanent in it still decides); one with a nil
// Err, or a nil *BatchError, fails with an error saying so.
func (s *Subscriber) batchFailure(err error, run []*item) (int, error) {
	var be *keyorder.BatchError
	if !errors.As(err, &be) {
		return 0, err
	}
	if be == nil {
		// A nil *BatchError returned as an error: its Error would panic.
		return 0, errors.New("subscribe: batch handler returned a nil *keyorder.BatchError")
	}
	i, cause := be.Index, be.Err
	if cause == nil {
		cause = fmt.Errorf("subscribe: batch handler returned a *keyorder.BatchError at index %d with a nil Err", i)
	}
	if i < 0 || i >= len(run) {
		s.cfg.Logger.Error("keyorder: batch handler reported a failure at an index outside the batch; the batch fails at index 0",
			"id", run[0].m.ID, "key", run[0].m.Key, "index", i, "size", len(run), "err", cause)
		return 0, fmt.Errorf("%w: index %d of a batch of %d: %w", ErrBatchIndex, i, len(run), cause)
	}
	return i, cause
}

// callBatch runs the batch handler, turning a panic into an error (which
// fails the batch at index 0). ends[k] ends the observation of run[k]'s
// attempt; nil without an observer. The handler's context is the one the
// observer returned for the batch's first message.
func (s *Subscriber) callBatch(ctx context.Context, h BatchHandlerFunc, run []*item) (ends []func(Outcome, error), err error) {
	ds := make([]*keyorder.Delivery, len(run))
	ends = make([]func(Outcome, error), len(run))
	hctx := ctx
	for k, it := range run {
		ds[k] = s.delivery(it)
		if s.cfg.Observer != nil {
			var c context.Context
			c, ends[k] = s.cfg.Observer.StartProcess(ctx, ds[k])
			if k == 0 {
				hctx = c
			}
		}
	}
	defer func() {
		if r := recover(); r != nil {
			s.stats.Panics.Add(1)
			err = &keyorder.PanicError{Value: r, Stack: debug.Stack()}
			s.cfg.Logger.Error("keyorder: batch handler panicked", "id", run[0].m.ID, "key", run[0].m.Key, "size", len(run), "panic", r)
		}
	}()
	return ends, h(hctx, ds)
}
