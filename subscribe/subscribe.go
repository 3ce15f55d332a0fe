// Package subscribe is the portable consuming API of keyorder.
//
// A Subscriber wraps a backend's adapters.Subscription driver and runs a
// handler on keyed worker lanes (package lanes), so one key keeps its order
// inside the process as it does on the broker. It owns everything that must
// behave the same on every broker: what a handler's result means, retries
// with backoff, the attempt budget, dead letters, keeping leases alive while
// a message is held or handled, suppressing redeliveries of messages this
// process already acknowledged, and graceful shutdown.
//
// # Ordering
//
// The subscription's policy (Capabilities.Ordering) is enforced twice: by
// the broker, and by the lanes in process. Where the broker holds a group
// natively (Capabilities.NativeHold) a failed message is returned with Nack
// and the broker holds its group; the rest of a chain received with it is
// returned unhandled. Elsewhere the failed message stays in its lane, its
// key parked until the retry time, its lease kept alive, and it is retried
// in process before anything behind it; the broker is never asked to
// redeliver it.
//
// # Delivery semantics
//
// The handler's result decides: nil acknowledges; an error retries with
// backoff (Config.Retry); keyorder.RetryAfter(err, d) retries not before d;
// keyorder.Permanent(err) dead-letters at once, as does running out of
// attempts. A panic is recovered and counts as a failed attempt. The
// handler's context is cancelled when the message's lease is lost or the
// subscriber shuts down past its deadline. Delivery is at least once;
// messages whose ID this process acknowledged recently are acknowledged
// again without running the handler.
package subscribe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters"
	"github.com/keyorder/keyorder/lanes"
	"github.com/keyorder/keyorder/policy"
)

// HandlerFunc handles one delivery; see the package documentation for what
// its result means.
type HandlerFunc func(ctx context.Context, d *keyorder.Delivery) error

// Middleware wraps a handler. Config.Middleware runs the first entry
// outermost.
type Middleware func(next HandlerFunc) HandlerFunc

// Defaults for Config.
const (
	WorkersDefault         = 8
	ShutdownTimeoutDefault = 30 * time.Second
	DedupeSizeDefault      = 10000
)

// Config configures a Subscriber. A nil *Config means all defaults.
type Config struct {
	// Workers is the number of lanes (Assign ByKey) or workers (Shared).
	// Defaults to WorkersDefault.
	Workers int
	// Assign decides how keys map onto workers. Defaults to lanes.ByKey.
	Assign lanes.Assignment
	// Retry is the attempt budget and backoff. MaxAttempts defaults to
	// policy.MaxAttemptsDefault.
	Retry policy.Retry
	// MaxOutstanding bounds the messages received and not yet finished.
	// Messages waiting in process on a time (a retry or a not-before time)
	// are not counted, nor, under Ordered where the process holds groups,
	// the messages of their key behind them: a held key must not stop the
	// others. The lanes bound those (see lanes.Config.Capacity). Defaults to
	// 2×Workers.
	MaxOutstanding int
	// ShutdownTimeout is how long Run waits for running handlers after its
	// context ends. Defaults to ShutdownTimeoutDefault.
	ShutdownTimeout time.Duration
	// DedupeSize is how many acknowledged message IDs are remembered to
	// suppress redeliveries. Defaults to DedupeSizeDefault; negative disables.
	DedupeSize int
	// Middleware wraps the handler, first entry outermost.
	Middleware []Middleware
	// Logger receives the subscriber's logs. Defaults to slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with defaults applied.
func (c *Config) WithDefaults() *Config {
	out := &Config{}
	if c != nil {
		*out = *c
	}
	if out.Workers == 0 {
		out.Workers = WorkersDefault
	}
	out.Retry = out.Retry.WithDefaults()
	if out.MaxOutstanding == 0 {
		out.MaxOutstanding = 2 * out.Workers
	}
	if out.ShutdownTimeout == 0 {
		out.ShutdownTimeout = ShutdownTimeoutDefault
	}
	if out.DedupeSize == 0 {
		out.DedupeSize = DedupeSizeDefault
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

func (c *Config) validate() error {
	switch {
	case c.Workers < 0:
		return fmt.Errorf("%w: subscribe.Config.Workers must be positive, got %d", keyorder.ErrInvalidConfig, c.Workers)
	case c.MaxOutstanding < 0:
		return fmt.Errorf("%w: subscribe.Config.MaxOutstanding must be positive, got %d", keyorder.ErrInvalidConfig, c.MaxOutstanding)
	case c.ShutdownTimeout < 0:
		return fmt.Errorf("%w: subscribe.Config.ShutdownTimeout must not be negative", keyorder.ErrInvalidConfig)
	}
	if err := c.Retry.Validate(); err != nil {
		return fmt.Errorf("%w: subscribe.Config.Retry: %v", keyorder.ErrInvalidConfig, err)
	}
	return nil
}

// Subscriber consumes one subscription.
type Subscriber struct {
	drv  adapters.Subscription
	cfg  *Config
	caps adapters.Capabilities
	name string

	running  atomic.Bool
	closing  atomic.Bool
	shutdown chan struct{}
	stopOnce sync.Once
	done     chan struct{}

	tokens chan struct{}
	acks   chan *item

	// holdKeys: Ordered without native hold, so a key whose head waits in
	// process on a time holds the key's later messages in process too.
	holdKeys bool
	seq      uint64 // receive order; pump only

	mu          sync.Mutex
	outstanding map[*item]struct{}
	// parked counts, per key, the items waiting in process on a time (a
	// retry or a not-before time) while holdKeys. The key's other items
	// received meanwhile wait behind them and, like them, do not count
	// against MaxOutstanding, so a parked key cannot stop the others.
	parked map[string]int

	acked *idSet
	stats Stats
}

// Stats counts what a Subscriber did.
type Stats struct {
	Handled      atomic.Int64 // handler calls
	Acked        atomic.Int64
	Retried      atomic.Int64
	DeadLettered atomic.Int64
	Suppressed   atomic.Int64 // redeliveries of acknowledged IDs
	LeasesLost   atomic.Int64
	Panics       atomic.Int64
}

// item is one received message on its way through the lanes.
type item struct {
	m       *adapters.Message
	attempt int
	chain   *chain
	seq     uint64 // receive order
	lost    atomic.Bool

	// Guarded by Subscriber.mu.
	hasToken bool // holds a flow-control token
	parked   bool // counted in Subscriber.parked
	// round is closed when the last lease renewal that included the item
	// has returned.
	round chan struct{}

	mu     sync.Mutex
	cancel context.CancelFunc

	// d is the first attempt's Delivery, allocated with the item; later
	// attempts get their own, since a handler may keep the one it was given.
	d      keyorder.Delivery
	called bool
}

// chain links consecutive messages of one key received together from a
// native-hold broker; when one fails under Ordered the rest go back.
type chain struct{ broken atomic.Bool }

// Open opens a Subscriber for the subscription named by urlstr, through the
// scheme registered on adapters.DefaultMux.
func Open(ctx context.Context, urlstr string, cfg *Config) (*Subscriber, error) {
	drv, err := adapters.DefaultMux().OpenSubscription(ctx, urlstr)
	if err != nil {
		return nil, err
	}
	s, err := New(drv, cfg)
	if err != nil {
		drv.Close()
		return nil, err
	}
	s.name = urlstr
	return s, nil
}

// New returns a Subscriber over a driver.
func New(drv adapters.Subscription, cfg *Config) (*Subscriber, error) {
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	s := &Subscriber{
		drv: drv, cfg: c, caps: drv.Capabilities(),
		shutdown:    make(chan struct{}),
		done:        make(chan struct{}),
		tokens:      make(chan struct{}, c.MaxOutstanding),
		acks:        make(chan *item, c.MaxOutstanding),
		outstanding: map[*item]struct{}{},
		parked:      map[string]int{},
		acked:       newIDSet(c.DedupeSize),
	}
	if s.caps.MaxBatch <= 0 {
		s.caps.MaxBatch = 1
	}
	s.holdKeys = !s.caps.NativeHold && s.caps.Ordering == policy.Ordered
	return s, nil
}

// Stats returns the subscriber's counters.
func (s *Subscriber) Stats() *Stats { return &s.stats }

// Capabilities returns the driver's capabilities.
func (s *Subscriber) Capabilities() adapters.Capabilities { return s.caps }

// Run receives and handles messages until ctx ends or Shutdown is called,
// then shuts down gracefully: it stops receiving, lets running handlers
// finish for up to Config.ShutdownTimeout (then cancels their contexts),
// returns messages never started to the broker, and returns nil. On a
// broker that holds groups natively (Capabilities.NativeHold) it first
// handles, within the same ShutdownTimeout, the messages it has already
// received: nothing of those waits in process for a retry, and a message
// handed back unstarted costs a receive that a broker counting every
// receive (SQS) would report to the next consumer as an attempt. It returns
// an error if the subscription fails permanently. Run may be called once.
func (s *Subscriber) Run(ctx context.Context, h HandlerFunc) error {
	if h == nil {
		return fmt.Errorf("%w: nil handler", keyorder.ErrInvalidConfig)
	}
	if !s.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: Run called twice", keyorder.ErrInvalidConfig)
	}
	defer close(s.done)
	for i := len(s.cfg.Middleware) - 1; i >= 0; i-- {
		h = s.cfg.Middleware[i](h)
	}
	pool, err := lanes.New(&lanes.Config{
		Workers:  s.cfg.Workers,
		Assign:   s.cfg.Assign,
		Ordering: s.caps.Ordering,
	}, func(ctx context.Context, key string, keyed bool, it *item) lanes.Result {
		return s.handle(ctx, h, it)
	})
	if err != nil {
		return err
	}
	rctx, stopReceiving := context.WithCancel(ctx)
	defer stopReceiving()
	go func() {
		select {
		case <-s.shutdown:
			stopReceiving()
		case <-rctx.Done():
		}
	}()

	leaseDone := make(chan struct{})
	leaseCtx, stopLeases := context.WithCancel(context.WithoutCancel(ctx))
	go s.keepLeases(leaseCtx, leaseDone)
	ackDone := make(chan struct{})
	go s.acker(ackDone)

	runErr := s.pump(rctx, pool)

	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	if s.caps.NativeHold && runErr == nil {
		s.drain(sctx)
	}
	s.closing.Store(true)
	leftover, _ := pool.Close(sctx)
	cancel()
	if len(leftover) > 0 {
		live := leftover[:0]
		for _, it := range leftover {
			if it.lost.Load() {
				s.forget(it)
			} else {
				live = append(live, it)
			}
		}
		s.giveBack(live)
	}
	close(s.acks)
	<-ackDone
	stopLeases()
	<-leaseDone
	return runErr
}

// drain waits until every message received has been settled, or ctx ends.
// On a broker that holds groups natively nothing waits in process for a
// retry, so what was received can run now: running it, rather than handing
// it back unstarted, keeps another process from counting this receive as
// an attempt (SQS counts every receive; see adapters/sqs).
func (s *Subscriber) drain(ctx context.Context) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		s.mu.Lock()
		n := len(s.outstanding)
		s.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Shutdown makes Run stop receiving and return after its graceful shutdown.
// It waits until Run has returned (immediately if Run was never called) or
// ctx ends.
func (s *Subscriber) Shutdown(ctx context.Context) error {
	s.stopOnce.Do(func() { close(s.shutdown) })
	if !s.running.Load() {
		return nil
	}
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close closes the driver. Call it after Run has returned.
func (s *Subscriber) Close() error { return s.drv.Close() }

// pump receives messages and submits them to the lanes until ctx ends or a
// permanent error occurs.
func (s *Subscriber) pump(ctx context.Context, pool *lanes.Pool[*item]) error {
	failures := 0
	var its []*item
	for {
		n, err := s.acquire(ctx)
		if err != nil {
			return nil
		}
		ms, err := s.drv.Receive(ctx, n)
		if len(ms) > n {
			// A driver broke its contract; the extra messages carry no
			// token rather than releasing tokens never taken (which would
			// block the pump for good).
			s.cfg.Logger.Error("keyorder: driver returned more messages than asked", "asked", n, "got", len(ms))
		}
		s.releaseTokens(n - min(len(ms), n))
		if err != nil && len(ms) > 0 && s.caps.NativeHold && ctx.Err() != nil {
			// Received as Run stops: they run with the rest before Run
			// returns (see drain).
			err = nil
		}
		if err != nil && len(ms) > 0 {
			// Messages that came with an error go back unhandled; their
			// tokens with them.
			its = its[:0]
			for i, m := range ms {
				its = append(its, &item{m: m, hasToken: i < n})
			}
			s.giveBack(its)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !s.drv.IsRetryable(err) {
				return &keyorder.Error{Code: s.drv.ErrorCode(err), Op: "receive", Err: err}
			}
			failures++
			s.cfg.Logger.Warn("keyorder: receive failed; retrying", "err", err, "failures", failures)
			t := time.NewTimer(s.cfg.Retry.Backoff(failures))
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			continue
		}
		failures = 0
		// Link chains before any item reaches a lane.
		clear(its)
		its = its[:0]
		var prev *item
		for i, m := range ms {
			s.seq++
			it := &item{m: m, attempt: max(m.Attempt, 1), hasToken: i < n, seq: s.seq}
			if s.caps.NativeHold && s.caps.Ordering == policy.Ordered && m.Key != "" {
				if prev != nil && prev.m.Key == m.Key {
					if prev.chain == nil {
						prev.chain = &chain{}
					}
					it.chain = prev.chain
				}
				prev = it
			}
			its = append(its, it)
		}
		now := time.Now()
		for i, it := range its {
			m := it.m
			free := 0
			s.mu.Lock()
			s.outstanding[it] = struct{}{}
			switch {
			case m.NotBefore.After(now):
				// Waiting on time, like a retry: not counted. Under
				// holdKeys it parks its key.
				it.hasToken = false
				free++
				if s.holdKeys && m.Key != "" {
					it.parked = true
					s.parked[m.Key]++
				}
			case s.holdKeys && m.Key != "" && s.parked[m.Key] > 0:
				// Behind a parked head of its key.
				it.hasToken = false
				free++
			}
			s.mu.Unlock()
			s.releaseTokens(free)
			if err := pool.Submit(ctx, m.Key, m.Key != "", m.NotBefore, it); err != nil {
				// Shutting down: give this one and the rest back
				// unhandled, all of them, so that none of a key is
				// handled after one before it went back.
				s.giveBack(its[i:])
				break
			}
		}
	}
}

// giveBack returns received items to the broker unhandled, without counting
// an attempt, and forgets them.
func (s *Subscriber) giveBack(its []*item) {
	ms := make([]*adapters.Message, 0, len(its))
	for _, it := range its {
		ms = append(ms, it.m)
	}
	if len(ms) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.detach(its...)
	err := s.drv.Release(ctx, ms)
	if err != nil {
		s.cfg.Logger.Warn("keyorder: returning unhandled messages failed; the broker will redeliver them", "count", len(ms), "err", err)
	}
	for _, it := range its {
		s.forget(it)
	}
}

// detach takes items out of outstanding before they are handed back (Nack,
// Release, DeadLetter), so no later lease renewal includes them, and waits
// for a renewal under way that does: on brokers where a renewal and a
// hand-back both set a message's visibility, a renewal reaching the broker
// after the hand-back would undo it.
func (s *Subscriber) detach(its ...*item) {
	s.mu.Lock()
	for _, it := range its {
		delete(s.outstanding, it)
	}
	s.mu.Unlock()
	for _, it := range its {
		if it.round != nil {
			<-it.round
		}
	}
}

// acquire takes one flow-control token (blocking) and as many more as are
// free, up to a receive batch.
func (s *Subscriber) acquire(ctx context.Context) (int, error) {
	select {
	case s.tokens <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	n := 1
	for n < s.caps.MaxBatch {
		select {
		case s.tokens <- struct{}{}:
			n++
		default:
			return n, nil
		}
	}
	return n, nil
}

func (s *Subscriber) releaseTokens(n int) {
	for range n {
		<-s.tokens
	}
}

// forget drops an item from the outstanding set and gives back its token.
func (s *Subscriber) forget(it *item) {
	s.mu.Lock()
	delete(s.outstanding, it)
	tok := it.hasToken
	it.hasToken = false
	s.mu.Unlock()
	if tok {
		s.releaseTokens(1)
	}
}

// park gives back the token of an item that waits in process for its retry.
// Under holdKeys it parks the item's key: the key's items already received
// wait behind it and give back their tokens too.
func (s *Subscriber) park(it *item) {
	free := 0
	s.mu.Lock()
	if it.hasToken {
		it.hasToken = false
		free++
	}
	if key := it.m.Key; s.holdKeys && key != "" {
		it.parked = true
		s.parked[key]++
		for o := range s.outstanding {
			if o.hasToken && o.m.Key == key {
				o.hasToken = false
				free++
			}
		}
	}
	s.mu.Unlock()
	s.releaseTokens(free)
}

// unpark is called when a parked item's time has come.
func (s *Subscriber) unpark(it *item) {
	key := it.m.Key
	s.mu.Lock()
	it.parked = false
	if s.parked[key]--; s.parked[key] <= 0 {
		delete(s.parked, key)
	}
	s.mu.Unlock()
}

// drop forgets an item whose lease was lost: the broker redelivers it. The
// rest of its chain must not run before that redelivery, so the chain goes
// back too.
func (s *Subscriber) drop(it *item) {
	if it.chain != nil {
		it.chain.broken.Store(true)
	}
	s.forget(it)
}

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
	batch := make([]*item, 0, ackBatchMax)
	ms := make([]*adapters.Message, 0, ackBatchMax)
	var actx timeoutCtx
	defer actx.stop()
	for it := range s.acks {
		batch = append(batch[:0], it)
	more:
		for len(batch) < ackBatchMax {
			select {
			case it, ok := <-s.acks:
				if !ok {
					break more
				}
				batch = append(batch, it)
			default:
				break more
			}
		}
		ms = ms[:0]
		s.mu.Lock() // out of outstanding: a renewal now does not call them lost
		for _, it := range batch {
			ms = append(ms, it.m)
			delete(s.outstanding, it)
		}
		s.mu.Unlock()
		if err := s.drv.Ack(actx.get(), ms); err != nil {
			s.cfg.Logger.Warn("keyorder: acknowledging messages failed; the broker may redeliver them", "count", len(ms), "err", err)
		}
		for _, it := range batch {
			s.forget(it)
		}
		clear(batch)
		clear(ms)
	}
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

// settle runs a driver call that finishes an item, logging its failure.
func (s *Subscriber) settle(it *item, call func(ctx context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.detach(it)
	err := call(ctx)
	if err != nil {
		s.cfg.Logger.Warn("keyorder: settling message failed; the broker will redeliver it", "id", it.m.ID, "key", it.m.Key, "err", err)
	}
	s.forget(it)
}

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
	if it.chain != nil && it.chain.broken.Load() {
		s.settle(it, func(ctx context.Context) error { return s.drv.Release(ctx, []*adapters.Message{m}) })
		return lanes.Done()
	}
	if it.attempt > s.cfg.Retry.MaxAttempts {
		// Lost leases used up the budget before a handler could finish.
		s.deadLetter(it, fmt.Sprintf("attempts exhausted (%d) by lost leases", it.attempt-1))
		return lanes.Done()
	}
	hctx, cancel := context.WithCancel(ctx)
	it.mu.Lock()
	it.cancel = cancel
	it.mu.Unlock()
	if it.lost.Load() {
		cancel()
	}
	err := s.call(hctx, h, it)
	it.mu.Lock()
	it.cancel = nil
	it.mu.Unlock()
	cancel()
	s.stats.Handled.Add(1)

	if err == nil {
		s.acked.add(m.ID)
		s.stats.Acked.Add(1)
		s.acks <- it
		return lanes.Done()
	}
	if it.lost.Load() {
		s.drop(it) // the broker took it back; it counted the attempt
		return lanes.Done()
	}
	if s.closing.Load() && ctx.Err() != nil {
		// Cancelled by shutdown: not the message's fault.
		if it.chain != nil {
			it.chain.broken.Store(true)
		}
		s.settle(it, func(ctx context.Context) error { return s.drv.Release(ctx, []*adapters.Message{m}) })
		return lanes.Done()
	}
	var perm *keyorder.PermanentError
	if errors.As(err, &perm) {
		s.deadLetter(it, err.Error())
		return lanes.Done()
	}
	if it.attempt >= s.cfg.Retry.MaxAttempts {
		s.deadLetter(it, fmt.Sprintf("max attempts (%d) reached: %v", s.cfg.Retry.MaxAttempts, err))
		return lanes.Done()
	}
	delay := s.cfg.Retry.Backoff(it.attempt)
	var re *keyorder.RetryError
	if errors.As(err, &re) {
		delay = re.After
	}
	s.stats.Retried.Add(1)
	s.cfg.Logger.Debug("keyorder: handler failed; retrying", "id", m.ID, "key", m.Key, "attempt", it.attempt, "delay", delay, "err", err)
	if s.caps.NativeHold {
		if it.chain != nil {
			it.chain.broken.Store(true)
		}
		s.settle(it, func(ctx context.Context) error { return s.drv.Nack(ctx, m, delay) })
		return lanes.Done()
	}
	// Hold in process: the item stays in its lane, its key parked, its
	// lease kept alive; its flow-control token is returned so other keys
	// keep flowing.
	it.attempt++
	s.park(it)
	return lanes.RetryAt(time.Now().Add(delay))
}

func (s *Subscriber) deadLetter(it *item, reason string) {
	s.stats.DeadLettered.Add(1)
	s.cfg.Logger.Warn("keyorder: message dead-lettered", "id", it.m.ID, "key", it.m.Key, "attempts", it.attempt, "reason", reason)
	s.settle(it, func(ctx context.Context) error { return s.drv.DeadLetter(ctx, it.m, reason, it.attempt) })
}

// call runs the handler, turning a panic into an error.
func (s *Subscriber) call(ctx context.Context, h HandlerFunc, it *item) (err error) {
	m := it.m
	headers := make(map[string]string, len(m.Headers)+1)
	for k, v := range m.Headers {
		headers[k] = v
	}
	if m.Key != "" {
		headers[keyorder.HeaderPartitionKey] = m.Key
	}
	d := &it.d
	if it.called {
		d = new(keyorder.Delivery)
	}
	it.called = true
	*d = keyorder.Delivery{
		Message: keyorder.Message{
			ID: m.ID, Key: m.Key, Payload: m.Payload, Headers: headers, NotBefore: m.NotBefore,
		},
		Attempt:      it.attempt,
		PublishTime:  m.PublishTime,
		Subscription: s.name,
	}
	defer func() {
		if r := recover(); r != nil {
			s.stats.Panics.Add(1)
			err = &keyorder.PanicError{Value: r, Stack: debug.Stack()}
			s.cfg.Logger.Error("keyorder: handler panicked", "id", m.ID, "key", m.Key, "panic", r)
		}
	}()
	return h(ctx, d)
}

// keepLeases renews the leases of outstanding messages and cancels the
// handlers of those whose lease was lost.
func (s *Subscriber) keepLeases(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	if s.caps.LeaseDuration <= 0 {
		<-ctx.Done()
		return
	}
	t := time.NewTicker(s.caps.LeaseDuration / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		if len(s.outstanding) == 0 {
			s.mu.Unlock()
			continue
		}
		round := make(chan struct{})
		ms := make([]*adapters.Message, 0, len(s.outstanding))
		byMsg := make(map[*adapters.Message]*item, len(s.outstanding))
		for it := range s.outstanding {
			ms = append(ms, it.m)
			byMsg[it.m] = it
			it.round = round
		}
		s.mu.Unlock()
		lost, err := s.drv.ExtendLeases(ctx, ms)
		close(round)
		if err != nil {
			s.cfg.Logger.Warn("keyorder: extending leases failed", "err", err)
		}
		if len(lost) == 0 {
			continue
		}
		// An item settled while its lease was being extended is reported
		// lost by brokers that forget settled messages: it was not.
		var gone []*item
		s.mu.Lock()
		for _, m := range lost {
			if it := byMsg[m]; it != nil && !it.lost.Load() {
				if _, ok := s.outstanding[it]; ok {
					gone = append(gone, it)
				}
			}
		}
		s.mu.Unlock()
		// Mark later items first, and all before cancelling any handler: a
		// lane that sees an item lost then sees its lost successors lost
		// too, and does not run one in the moment between.
		slices.SortFunc(gone, func(a, b *item) int { return cmp.Compare(b.seq, a.seq) })
		for _, it := range gone {
			it.lost.Store(true)
		}
		for _, it := range gone {
			s.stats.LeasesLost.Add(1)
			it.mu.Lock()
			if it.cancel != nil {
				it.cancel()
			}
			it.mu.Unlock()
		}
	}
}

// DeadLetters lists the subscription's dead letters, if the backend keeps
// them where they can be listed.
func (s *Subscriber) DeadLetters(ctx context.Context, limit int) ([]adapters.DeadLetter, error) {
	st, ok := s.drv.(adapters.DeadLetterStore)
	if !ok {
		return nil, fmt.Errorf("dead letters: %w", keyorder.ErrUnsupported)
	}
	return st.DeadLetters(ctx, limit)
}

// Redrive puts dead letters back on the subscription, after everything that
// arrived meanwhile.
func (s *Subscriber) Redrive(ctx context.Context, ids []string) (int, error) {
	st, ok := s.drv.(adapters.DeadLetterStore)
	if !ok {
		return 0, fmt.Errorf("redrive: %w", keyorder.ErrUnsupported)
	}
	return st.Redrive(ctx, ids)
}

// idSet remembers the last n IDs added.
type idSet struct {
	mu   sync.Mutex
	ring []string
	next int
	set  map[string]struct{}
}

func newIDSet(n int) *idSet {
	if n < 0 {
		n = 0
	}
	return &idSet{ring: make([]string, n), set: make(map[string]struct{}, n)}
}

func (s *idSet) add(id string) {
	if len(s.ring) == 0 || id == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.set[id]; ok {
		return
	}
	if old := s.ring[s.next]; old != "" {
		delete(s.set, old)
	}
	s.ring[s.next] = id
	s.set[id] = struct{}{}
	s.next = (s.next + 1) % len(s.ring)
}

func (s *idSet) has(id string) bool {
	if len(s.ring) == 0 || id == "" {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.set[id]
	return ok
}
