package subscribe

// This file: the Subscriber, how it is opened, and its lifecycle (Run,
// drain, Close).

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/slab"
	"github.com/keyorder/keyorder/lanes"
	"github.com/keyorder/keyorder/policy"
)

// Subscriber consumes one subscription.
type Subscriber struct {
	drv  driver.Subscription
	cfg  *Config
	caps keyorder.Capabilities
	name string

	running  atomic.Bool
	closing  atomic.Bool // Run is shutting down
	closed   atomic.Bool // Close was called
	shutdown chan struct{}
	stopOnce sync.Once
	kill     chan struct{} // closed when Close's deadline ends first
	done     chan struct{}
	// abandoned: Run returned while handlers still ran (Close's deadline
	// ended first); what they return is not acted on (abandon).
	abandoned atomic.Bool
	// leasesDone is closed when the lease keeper has stopped: as Run
	// returns, or, when Run abandoned handlers, once the last of them has
	// returned (their leases are renewed until then, so no other consumer
	// takes their keys while they run). abandonWake: one of them returned.
	leasesDone  chan struct{}
	abandonWake chan struct{}
	// born is when New made the Subscriber: attempts record their start
	// as time since born (attemptCtx.begun).
	born time.Time

	tokens *tokens
	acks   *ackQueue

	// holdKeys: Ordered without native hold (or with HoldChains), so a
	// key whose head waits in process on a time holds the key's later
	// messages in process too.
	holdKeys bool
	// releaseRedelivers: the driver's Release hands messages out again to
	// this process in key order (driver.ReleaseRedeliverer).
	releaseRedelivers bool
	seq               uint64          // receive order; pump only
	items             slab.Slab[item] // the pump's items (itemSlab at a time); pump only
	// payloads holds the copies of first attempts' payloads (item.first),
	// payloadChunk bytes at a time; pump only.
	payloads slab.Bytes

	mu          sync.Mutex
	outstanding outList
	// holds is each key's one owner under holdKeys (see hold.go).
	holds      map[string]*keyHold
	holdsSpare []*keyHold
	// lostKeys: the keys waiting for a lost message's redelivery (see
	// lostkey.go).
	lostKeys map[string]*barrier
	// revocations: the revocations running, and those that ended since
	// the pump's last registration of what it received; revokeGen counts
	// their starts and ends (see revoke.go).
	revocations []*revocation
	revokeGen   atomic.Uint64
	// revokeWaits: for each item revoked while it ran (item.revoking),
	// closed when its run's result has reached the driver.
	revokeWaits map[*item]chan struct{}
	// held counts the outstanding items that hold no flow-control token
	// (item.held); while it is at Config.MaxHeld the pump does not
	// receive (see waitHeld). heldWait: the pump waits for heldRoom.
	// peak is the most items ever outstanding at once.
	held     int
	heldWait bool
	heldRoom chan struct{}
	peak     int

	// acked: the IDs of the messages this process acknowledged, so that a
	// redelivery of one does not run; under acksFinal (driver.FinalAcker)
	// only those whose Ack failed (see ack).
	acked     *idSet
	acksFinal bool
	// undead remembers, per message ID, the dead letters this process
	// made, so a redelivery of the same copy is not run: dead-lettered
	// again if the DeadLetter call was given up, else acknowledged
	// (undeadNote, redeliveredDead).
	undead *noteSet[deadNote]
	stats  counters

	// settling tracks acknowledgements being retried off the acker.
	settling sync.WaitGroup

	unobserve func() // from Config.Observer.Attach; see observe.go

	// batcher groups received messages into batches under RunBatch; nil
	// under Run. outstandingAsked: Config.MaxOutstanding was set, so
	// RunBatch keeps it.
	batcher          *batcher
	outstandingAsked bool

	throttles *throttler // Config.Throttles; nil without
}

// counters count what a Subscriber did; Stats reads them.
type counters struct {
	Handled        atomic.Int64
	Acked          atomic.Int64
	Retried        atomic.Int64
	DeadLettered   atomic.Int64
	Suppressed     atomic.Int64
	LeasesLost     atomic.Int64
	Panics         atomic.Int64
	SettleRetries  atomic.Int64
	SettleFailures atomic.Int64
	Throttled      atomic.Int64
}

// Open opens a Subscriber for the subscription named by urlstr, through the
// scheme registered on driver.DefaultMux.
func Open(ctx context.Context, urlstr string, cfg *Config) (*Subscriber, error) {
	drv, err := driver.DefaultMux().OpenSubscription(ctx, urlstr)
	if err != nil {
		return nil, err
	}
	s, err := New(drv, cfg)
	if err != nil {
		drv.Close()
		return nil, err
	}
	return s, nil
}

// New returns a Subscriber over a driver.
func New(drv driver.Subscription, cfg *Config) (*Subscriber, error) {
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
		kill:        make(chan struct{}),
		born:        time.Now(),
		done:        make(chan struct{}),
		leasesDone:  make(chan struct{}),
		abandonWake: make(chan struct{}, 1),
		tokens:      newTokens(c.MaxOutstanding),
		acks:        newAckQueue(),
		items:       slab.New[item](itemSlab),
		payloads:    slab.NewBytes(payloadChunk),
		holds:       map[string]*keyHold{},
		heldRoom:    make(chan struct{}, 1),
		acked:       newIDSet(c.DedupeSize),
		undead:      newNoteSet[deadNote](c.DedupeSize),
	}
	s.outstandingAsked = cfg != nil && cfg.MaxOutstanding != 0
	if s.caps.MaxBatch <= 0 {
		s.caps.MaxBatch = 1
	}
	s.caps.HoldChains = s.caps.HoldChains && s.caps.NativeHold && s.caps.Ordering == policy.Ordered
	s.holdKeys = (!s.caps.NativeHold || s.caps.HoldChains) && s.caps.Ordering == policy.Ordered
	s.throttles = newThrottler(c.Throttles)
	if n, ok := drv.(driver.Namer); ok {
		s.name = n.Name()
	}
	if r, ok := drv.(driver.ReleaseRedeliverer); ok {
		s.releaseRedelivers = r.ReleaseRedelivers()
	}
	if f, ok := drv.(driver.FinalAcker); ok {
		s.acksFinal = f.AcksFinal()
	}
	s.observeAttach()
	return s, nil
}

// Capabilities returns the driver's capabilities.
func (s *Subscriber) Capabilities() keyorder.Capabilities { return s.caps }

// Run receives and handles messages until ctx ends or Close is called,
// then shuts down gracefully: it stops receiving, lets running handlers
// finish for up to Config.ShutdownTimeout (then cancels their contexts),
// returns messages never started to the broker, and returns nil. On a
// broker that holds groups natively (Capabilities.NativeHold) it first
// handles, within the same ShutdownTimeout, the messages it has already
// received (and, under Capabilities.HoldChains, the in-process retries of
// held chains): a message handed back unstarted costs a receive that a
// broker counting every receive (SQS) would report to the next consumer as
// an attempt. It returns
// an error if the subscription fails permanently. Run may be called once,
// and not after Close (it then returns keyorder.ErrClosed). After Run
// returns, call Close to release the subscription.
func (s *Subscriber) Run(ctx context.Context, h HandlerFunc) error {
	if h == nil {
		return fmt.Errorf("%w: nil handler", keyorder.ErrInvalidConfig)
	}
	if err := s.begin(); err != nil {
		return err
	}
	for i := len(s.cfg.Middleware) - 1; i >= 0; i-- {
		h = s.cfg.Middleware[i](h)
	}
	pool, err := lanes.New(s.lanesConfig(), func(ctx context.Context, key string, keyed bool, it *item) lanes.Result {
		return s.handle(ctx, h, it)
	})
	if err != nil {
		return err
	}
	return s.run(ctx, pool, nil)
}

// begin marks the Subscriber running (Run and RunBatch may be called once,
// and not after Close).
func (s *Subscriber) begin() error {
	if !s.running.CompareAndSwap(false, true) {
		if s.closed.Load() {
			return fmt.Errorf("subscribe: Run after Close: %w", keyorder.ErrClosed)
		}
		return fmt.Errorf("%w: Run called twice", keyorder.ErrInvalidConfig)
	}
	return nil
}

// lanesConfig is the configuration of the lanes Run and RunBatch run items
// on.
func (s *Subscriber) lanesConfig() *lanes.Config {
	return &lanes.Config{
		Workers:  s.cfg.Workers,
		Assign:   s.cfg.Assign,
		Ordering: s.caps.Ordering,
		// Room for everything the subscriber may hold, so a lane never
		// blocks the pump: a Submit that waited for a lane full of a
		// held key's backlog would stop every key (see waitHeld).
		Capacity: s.cfg.MaxOutstanding + s.cfg.MaxHeld,
		// Fairness: see fairness.go.
		Fair:       s.cfg.FairnessKey != nil,
		FairWeight: s.cfg.FairnessWeight,
	}
}

// run is the lifecycle Run and RunBatch share: under Run pool runs each
// received message as a lane item of its own; under RunBatch (pool nil)
// bpool runs the batches of one key's messages the batcher makes.
func (s *Subscriber) run(ctx context.Context, pool *lanes.Pool[*item], bpool *lanes.Pool[*batch]) error {
	defer close(s.done)
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

	if bpool != nil {
		s.batcher = newBatcher(s, bpool, rctx)
	}
	if r, ok := s.drv.(driver.Revocable); ok {
		r.SetRevoke(s.revoke)
	}
	runErr := s.pump(rctx, pool)
	var unbatched []*item // open batches, never handed to the lanes
	if s.batcher != nil {
		unbatched = s.batcher.stop()
		if s.caps.NativeHold {
			// The broker holds the keys; drain must not wait for these.
			s.giveBack(unbatched)
			unbatched = nil
		}
	}

	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	go func() {
		// Close's deadline ended before the graceful shutdown did.
		select {
		case <-s.kill:
			cancel()
		case <-sctx.Done():
		}
	}()
	if s.caps.NativeHold && runErr == nil {
		s.drain(sctx)
	}
	s.closing.Store(true)
	var leftover []*item
	closed := make(chan []*item, 1)
	go func() {
		if bpool != nil {
			bs, _ := bpool.Close(sctx)
			closed <- append(unbatch(bs), unbatched...)
		} else {
			its, _ := pool.Close(sctx)
			closed <- its
		}
	}()
	select {
	case leftover = <-closed:
	case <-s.kill:
		select {
		case leftover = <-closed:
		default:
			// Close's deadline ended while handlers still run, their
			// contexts cancelled: Run returns without them, and what
			// the lanes still hold is left to the broker.
			s.abandon()
		}
	}
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
		s.giveBackAtStop(live)
	}
	if aside := s.liftAllBarriers(); len(aside) > 0 {
		s.cutBack(aside)
	}
	s.acks.close()
	<-ackDone
	s.settling.Wait()
	if s.abandoned.Load() {
		// Handlers Run gave up on still run: their leases are kept until
		// they return (the driver is closed after that; see Close).
		go func() {
			s.waitAbandoned()
			stopLeases()
			<-leaseDone
			close(s.leasesDone)
		}()
		return runErr
	}
	stopLeases()
	<-leaseDone
	close(s.leasesDone)
	return runErr
}

// waitAbandoned returns once every handler Run abandoned has returned:
// abandon left only their items outstanding, and each leaves as its
// handler returns (abandonedReturned).
func (s *Subscriber) waitAbandoned() {
	for {
		s.mu.Lock()
		n := s.outstanding.n
		s.mu.Unlock()
		if n == 0 {
			return
		}
		<-s.abandonWake
	}
}

// abandonedReturned is a handler Run abandoned returning: what it ran
// leaves the outstanding set unsettled (left to the broker), so its lease
// is no longer renewed.
func (s *Subscriber) abandonedReturned(run []*item) {
	s.forgetAll(run)
	select {
	case s.abandonWake <- struct{}{}:
	default:
	}
}

// drain waits until every message received has been settled, or ctx ends.
// On a broker that holds groups natively nothing waits in process for a
// retry (but a held chain's, under HoldChains, whose wait the retry
// policy bounds), so what was received can run now: running it, rather than handing
// it back unstarted, keeps another process from counting this receive as
// an attempt (SQS counts every receive; see adapters/sqs).
func (s *Subscriber) drain(ctx context.Context) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		s.mu.Lock()
		n := s.outstanding.n
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

// Close stops the subscriber and releases the subscription, as
// publish.Publisher.Close does for a publisher: it makes Run stop receiving
// and shut down gracefully (see Run), waits until Run has returned, and
// closes the driver. When ctx ends first, Close cuts the graceful shutdown
// short: running handlers' contexts are cancelled, and Run returns at once
// without waiting for them (each handler still running is logged with its
// message's key and ID and how long it has run; whatever it returns later
// is not acted on), messages not yet settled are left to the broker; Close
// then returns ctx's error. The leases of the messages whose handlers still
// run are renewed until those handlers return, so that no other consumer
// takes their keys meanwhile; the driver is closed then (at once when none
// runs). If Run was never called,
// Close only closes the driver, and a later Run returns keyorder.ErrClosed.
// Calling Close again returns keyorder.ErrClosed.
//
// A handler may call Close to stop consuming (a fatal condition), passing
// its own ctx or one derived from it: Close then starts the shutdown and
// returns nil at once, without waiting for that handler (which Run waits
// for as for any other); the driver is closed when Run returns. Called
// from a handler with an unrelated ctx, Close cannot tell, and waits for
// Run until ctx ends.
func (s *Subscriber) Close(ctx context.Context) error {
	if !s.closed.CompareAndSwap(false, true) {
		return keyorder.ErrClosed
	}
	s.stopOnce.Do(func() { close(s.shutdown) })
	if s.calledFromHandler(ctx) {
		go func() {
			<-s.done
			<-s.leasesDone
			s.observeDetach()
			if cerr := s.drv.Close(); cerr != nil {
				s.cfg.Logger.Warn("keyorder: closing the subscription failed", "err", cerr)
			}
		}()
		return nil
	}
	var err error
	if !s.running.CompareAndSwap(false, true) {
		// Run was called: wait for its shutdown.
		select {
		case <-s.done:
		case <-ctx.Done():
			err = ctx.Err()
			close(s.kill)
			<-s.done
		}
		select {
		case <-s.leasesDone:
		default:
			// Handlers Run abandoned still run, their leases renewed:
			// the driver is closed when the last has returned.
			go func() {
				<-s.leasesDone
				s.observeDetach()
				if cerr := s.drv.Close(); cerr != nil {
					s.cfg.Logger.Warn("keyorder: closing the subscription failed", "err", cerr)
				}
			}()
			return err
		}
	}
	s.observeDetach()
	if cerr := s.drv.Close(); cerr != nil {
		err = errors.Join(err, driver.WrapError("close", cerr, s.drv.ErrorCode))
	}
	return err
}

// calledFromHandler reports whether ctx is (or derives from) the context
// of a handler attempt of this Subscriber that is running now.
func (s *Subscriber) calledFromHandler(ctx context.Context) bool {
	a, _ := ctx.Value(driver.AttemptKey).(*attempt)
	if a == nil {
		return false
	}
	c := (*attemptCtx)(a)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sub == s && len(c.members()) > 0
}

// abandon is Run giving up on the handlers still running when Close's
// deadline ended: it logs each (key, ID, how long it has run) and makes
// what they return be ignored (their messages are left to the broker).
func (s *Subscriber) abandon() {
	s.abandoned.Store(true)
	now := time.Since(s.born)
	s.mu.Lock()
	defer s.mu.Unlock()
	for it := s.outstanding.head; it != nil; {
		next := it.nextO
		it.mu.Lock()
		hctx := it.hctx
		var ran time.Duration
		if hctx != nil {
			ran = now - hctx.begun
		}
		it.mu.Unlock()
		if hctx == nil {
			// Not running: left to the broker, no longer renewed.
			s.removeOutstanding(it)
		} else {
			s.cfg.Logger.Error("keyorder: Close's context ended while a handler still runs; returning without it (its lease is renewed until it returns; its message is then left to the broker)",
				"key", it.m.Key, "id", it.m.ID, "running", ran)
		}
		it = next
	}
}
