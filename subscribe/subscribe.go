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
//
// Attempts are counted per message from the broker's delivery count
// (adapters.Message.Attempt) plus, where the process holds groups, the
// retries run in process. A broker without native hold never hears of
// those retries, so a process that dies takes them with it: the
// redelivery's count restarts from the broker's, and across a crash a
// message can run more than MaxAttempts times in total (on Pub/Sub the
// subscription's max delivery attempts bounds the deliveries; see the
// pubsub package). Where the broker holds groups (PostgreSQL, SQS) every
// retry goes through the broker and the count survives a crash.
//
// # Settlement under a flaky network
//
// Settling a message (Ack, Nack, Release, DeadLetter) and renewing leases
// (ExtendLeases) are retried with backoff while the driver reports the error
// retryable (adapters.Subscription.IsRetryable), a bounded number of times
// within a bounded time; drivers never retry on their own. A Nack, Release
// or DeadLetter is retried on the message's lane, so under Ordered the key
// moves on only after the broker has the settlement; acknowledgements are
// retried beside the batching acker, so one failing batch does not hold the
// others. A settlement given up (a permanent error, or retries exhausted) is
// logged and counted in Stats.SettleFailures and the message is left to the
// broker, which redelivers it when its lease expires; a redelivered message
// whose handler already succeeded is acknowledged without running again,
// and one this process dead-lettered is dead-lettered again (with its
// reason and attempts), also without running.
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
	// Retry is the attempt budget and backoff. The retry policy is a
	// property of the subscription, like its ordering: where the backend
	// stores one with the subscription (adapters.Capabilities.Retry;
	// PostgreSQL's max_attempts, min_backoff, max_backoff), the stored
	// settings run, and Retry fills only the fields the subscription leaves
	// zero. A Retry field that disagrees with the subscription is overridden
	// and the disagreement logged, so every consumer of a subscription
	// retries alike. NoJitter always comes from here. Fields still zero take
	// the policy package's defaults (MaxAttempts policy.MaxAttemptsDefault).
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
	// undead remembers, per message ID, the dead letters whose DeadLetter
	// call was given up, so a redelivery is dead-lettered again without
	// running the handler.
	undead *noteSet[deadNote]
	stats  Stats

	// settling tracks acknowledgements being retried off the acker.
	settling sync.WaitGroup
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
	// SettleRetries counts settlement calls (Ack, Nack, Release,
	// DeadLetter, ExtendLeases) repeated after a retryable failure.
	SettleRetries atomic.Int64
	// SettleFailures counts settlements given up (a permanent error, or
	// retries exhausted): the broker redelivers those messages when their
	// leases expire.
	SettleFailures atomic.Int64
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
	if s.name == "" {
		// A driver that does not know its name: the URL, never with its
		// secrets.
		if u, err := adapters.ParseURL(urlstr); err == nil {
			s.name = adapters.Redact(u)
		}
	}
	return s, nil
}

// New returns a Subscriber over a driver.
func New(drv adapters.Subscription, cfg *Config) (*Subscriber, error) {
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	caps := drv.Capabilities()
	if caps.Retry != nil {
		var asked policy.Retry
		if cfg != nil {
			asked = cfg.Retry
		}
		c.Retry = subscriptionRetry(*caps.Retry, asked, c.Logger)
		if err := c.Retry.Validate(); err != nil {
			return nil, fmt.Errorf("%w: the subscription's retry settings with subscribe.Config.Retry: %v", keyorder.ErrInvalidConfig, err)
		}
	}
	s := &Subscriber{
		drv: drv, cfg: c, caps: caps,
		shutdown:    make(chan struct{}),
		done:        make(chan struct{}),
		tokens:      make(chan struct{}, c.MaxOutstanding),
		acks:        make(chan *item, c.MaxOutstanding),
		outstanding: map[*item]struct{}{},
		parked:      map[string]int{},
		acked:       newIDSet(c.DedupeSize),
		undead:      newNoteSet[deadNote](c.DedupeSize),
	}
	if s.caps.MaxBatch <= 0 {
		s.caps.MaxBatch = 1
	}
	s.holdKeys = !s.caps.NativeHold && s.caps.Ordering == policy.Ordered
	if n, ok := drv.(adapters.Namer); ok {
		s.name = n.Name()
	}
	return s, nil
}

// subscriptionRetry returns the retry policy a subscriber runs: the
// subscription's stored settings, its zero fields filled from the
// consumer's, then the defaults. A consumer setting that disagrees with the
// subscription is logged and not used.
func subscriptionRetry(stored, asked policy.Retry, log *slog.Logger) policy.Retry {
	r := stored
	fill := func(name string, s *int64, a int64) {
		switch {
		case *s == 0:
			*s = a
		case a != 0 && a != *s:
			log.Warn("keyorder: subscribe.Config.Retry disagrees with the subscription's stored retry settings; the subscription's run",
				"field", name, "subscription", *s, "config", a)
		}
	}
	ma, mn, mx := int64(r.MaxAttempts), int64(r.MinBackoff), int64(r.MaxBackoff)
	fill("MaxAttempts", &ma, int64(asked.MaxAttempts))
	fill("MinBackoff", &mn, int64(asked.MinBackoff))
	fill("MaxBackoff", &mx, int64(asked.MaxBackoff))
	r = policy.Retry{MaxAttempts: int(ma), MinBackoff: time.Duration(mn), MaxBackoff: time.Duration(mx), NoJitter: asked.NoJitter}
	return r.WithDefaults()
}

// Retry returns the retry policy the subscriber runs (see Config.Retry).
func (s *Subscriber) Retry() policy.Retry { return s.cfg.Retry }

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
	s.settling.Wait()
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
	err := s.retrySettle(ctx, func(ctx context.Context) error { return s.drv.Release(ctx, ms) })
	if err != nil {
		s.stats.SettleFailures.Add(1)
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
			if s.drv.IsRetryable(err) {
				// Retried off the acker, so the acknowledgements queued
				// behind this batch are not held up by it.
				s.stats.SettleRetries.Add(1)
				s.settling.Add(1)
				go s.retryAck(slices.Clone(batch), slices.Clone(ms), err)
				clear(batch)
				clear(ms)
				continue
			}
			s.stats.SettleFailures.Add(1)
			s.cfg.Logger.Warn("keyorder: acknowledging messages failed; the broker may redeliver them", "count", len(ms), "err", err)
		}
		for _, it := range batch {
			s.forget(it)
		}
		clear(batch)
		clear(ms)
	}
}

// retryAck retries an acknowledgement that failed with a retryable error,
// with backoff, then forgets the batch's items whatever the outcome: an
// acknowledgement that never lands leaves the messages to the broker's
// redelivery, which the acknowledged-ID set suppresses.
func (s *Subscriber) retryAck(batch []*item, ms []*adapters.Message, err error) {
	defer s.settling.Done()
	ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
	defer cancel()
	if err := s.backoffRetry(ctx, 1, err, func(ctx context.Context) error { return s.drv.Ack(ctx, ms) }); err != nil {
		s.stats.SettleFailures.Add(1)
		s.cfg.Logger.Warn("keyorder: acknowledging messages failed after retries; the broker may redeliver them", "count", len(ms), "err", err)
	}
	for _, it := range batch {
		s.forget(it)
	}
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
	if dn, ok := s.undead.get(m.ID); ok {
		// A redelivery of a message this process dead-lettered, whose
		// DeadLetter call did not land: its fate is decided.
		s.deadLetterAs(it, dn.reason, dn.attempts)
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
	s.deadLetterAs(it, reason, it.attempt)
}

// deadLetterAs hands it to the driver's DeadLetter. If that is given up,
// the message's fate is remembered, so that its redelivery is
// dead-lettered again rather than run.
func (s *Subscriber) deadLetterAs(it *item, reason string, attempts int) {
	err := s.settle(it, func(ctx context.Context) error { return s.drv.DeadLetter(ctx, it.m, reason, attempts) })
	if err != nil {
		s.undead.put(it.m.ID, deadNote{reason: reason, attempts: attempts})
	} else {
		s.undead.remove(it.m.ID)
	}
}

// deadNote is a dead letter's reason and attempts, kept for its
// redelivery.
type deadNote struct {
	reason   string
	attempts int
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
	// A renewal that fails retryably is tried again after settleBackoff
	// (never later than the regular period); the next round collects the
	// messages still outstanding then, so a message settled meanwhile is
	// not renewed after its settlement.
	period := s.caps.LeaseDuration / 3
	t := time.NewTimer(period)
	defer t.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		next := period
		s.mu.Lock()
		if len(s.outstanding) == 0 {
			s.mu.Unlock()
			failures = 0
			t.Reset(next)
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
		switch {
		case err == nil:
			failures = 0
		case s.drv.IsRetryable(err) && failures+1 < settleTries:
			failures++
			s.stats.SettleRetries.Add(1)
			next = min(next, settleBackoff.Backoff(failures))
			s.cfg.Logger.Debug("keyorder: extending leases failed; retrying", "err", err, "failures", failures)
		default:
			failures = 0
			s.stats.SettleFailures.Add(1)
			s.cfg.Logger.Warn("keyorder: extending leases failed", "err", err)
		}
		t.Reset(next)
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
	dls, err := st.DeadLetters(ctx, limit)
	return dls, adapters.WrapError("dead letters", err, s.drv.ErrorCode)
}

// Redrive puts dead letters back on the subscription, after everything that
// arrived meanwhile.
func (s *Subscriber) Redrive(ctx context.Context, ids []string) (int, error) {
	st, ok := s.drv.(adapters.DeadLetterStore)
	if !ok {
		return 0, fmt.Errorf("redrive: %w", keyorder.ErrUnsupported)
	}
	n, err := st.Redrive(ctx, ids)
	return n, adapters.WrapError("redrive", err, s.drv.ErrorCode)
}

// noteSet remembers a value for each of the last n IDs put.
type noteSet[V any] struct {
	mu   sync.Mutex
	ring []string
	next int
	m    map[string]V
}

func newNoteSet[V any](n int) *noteSet[V] {
	return &noteSet[V]{ring: make([]string, max(n, 0)), m: map[string]V{}}
}

func (s *noteSet[V]) put(id string, v V) {
	if len(s.ring) == 0 || id == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[id]; !ok {
		if old := s.ring[s.next]; old != "" {
			delete(s.m, old)
		}
		s.ring[s.next] = id
		s.next = (s.next + 1) % len(s.ring)
	}
	s.m[id] = v
}

func (s *noteSet[V]) get(id string) (V, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[id]
	return v, ok
}

// remove forgets id's value; its ring slot is reused in turn.
func (s *noteSet[V]) remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
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
