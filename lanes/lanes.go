// Package lanes runs items on worker goroutines in keyed lanes, so that the
// order of a key survives the trip through a pool of workers. The consuming
// side of keyorder dispatches received messages through it, and it is just as
// useful without a broker.
//
// # Why lanes
//
// A broker that hands out a key's messages in order has done only half the
// job: a plain worker pool can still run message 2 of a key before message 1
// has finished. With Shared assignment (the default) every worker serves a
// single lane and the Ordering (see package policy) decides what may run
// together: under Ordered one item of a key at a time, in the order it was
// submitted, while any free worker takes the oldest item of another key.
// With ByKey assignment a key is hashed onto one of several lanes, and one
// lane has one worker, so one key always runs on one goroutine.
//
// Shared is the default because it never leaves a worker idle while an
// item could run. ByKey's lanes each have their own lock, which passes more
// items per second when handlers take next to no time, but its keys are
// bound to their lane: with 1,000 keys over 64 lanes some lanes get half as
// many keys again as the average, and with handlers that wait (1 ms each,
// in the Kafka benchmark) 64 ByKey workers kept 45 % of the ceiling busy
// against Shared's 71 %; a key with a backlog also delays the other keys of
// its lane.
//
// # Ordering
//
// Each lane is a queue that hands out the oldest deliverable item under the
// pool's policy.Ordering:
//
//   - Ordered (the zero value) allows at most one item of a key in flight,
//     and a retried or not-yet-due item holds everything of its key behind
//     it.
//   - Exclusive allows at most one item of a key in flight; an item waiting
//     for its retry lets later items of its key run first.
//   - Parallel puts no constraint on a key. Under ByKey the single worker of
//     a lane still runs a key's items one at a time, in order, except that a
//     retried item waits aside.
//
// A key that is waiting (a retry delay or a not-before time) parks only
// itself: its lane goes on serving other keys meanwhile. Items without a key
// belong to no group and run whenever a worker is free.
//
// # Fairness
//
// With Config.Fair a lane chooses among fairness keys (Item.Fairness, a
// tenant for example) round robin, optionally weighted by
// Config.FairWeight, instead of taking the oldest deliverable item: a
// fairness key with a thousand items waiting gets one turn, like a key with
// one. Ordering still wins: a key's items run in the key's order whatever
// their fairness keys (a key whose head belongs to one fairness key and
// its next item to another is served in order), and a pool whose items all
// share one key runs them in arrival order.
//
// Fairness reorders only what a lane holds: at most Config.Capacity waiting
// items per lane, and, under a subscriber, what flow control let the
// process receive. Items not yet submitted are not seen, so it cannot make
// a producer's backlog fair; with ByKey assignment each lane is fair on its
// own.
//
// # Bounded memory
//
// A lane holds at most Config.Capacity waiting items; Submit blocks while its
// lane is full, so a fast producer is slowed to the pace of the handlers
// instead of filling memory. Items handed back with RetryAt return to their
// lane without waiting for space, so a lane can briefly hold up to Capacity
// plus its in-flight items. Steady-state operation does not allocate: there is
// one context per pool, no goroutine and no closure per item.
//
// # Running in the caller
//
// SubmitOrRun is Submit for a caller that would wait for its item anyway
// (a middleware whose goroutine must return the handler's result): an item
// that can start at once runs in the calling goroutine, in a worker's
// place, without the hand-off to a worker and back; any other item is
// queued as Submit queues it. The key rules and the Workers bound are the
// same either way.
//
// # Shutdown
//
// Close stops admission, lets running handlers finish (cancelling their
// context if Close's own context ends first) and returns every item that is
// still waiting, so the caller can hand it back to wherever it came from.
package lanes

import (
	"cmp"
	"context"
	"fmt"
	"hash/maphash"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/internal/groupq"
	"github.com/keyorder/keyorder/policy"
)

// Assignment decides which lane an item goes to.
type Assignment int

const (
	// Shared (the zero value) uses one lane served by Config.Workers
	// workers: any free worker takes the oldest deliverable item, so no
	// worker idles while an item of another key could run, and a key with
	// a backlog delays no other key. The Ordering keeps a key's items in
	// order (one at a time under Exclusive and Ordered).
	Shared Assignment = iota
	// ByKey hashes the key onto Config.Workers lanes with one worker each:
	// one key always runs on one lane, in submission order. (The hash is
	// seeded per Pool: the same key may land on another lane in another
	// Pool.) Keyless items are spread over the lanes round-robin. A lane
	// has its own lock, so with handlers that take next to no time it
	// passes more items per second than Shared's one lock; but keys share
	// their lane's worker: a lane whose keys have more work queued runs
	// behind while other lanes' workers idle, and a key's backlog delays
	// the other keys of its lane.
	ByKey
)

// Valid reports whether a is ByKey or Shared. Config rejects any other
// value.
func (a Assignment) Valid() bool { return a == ByKey || a == Shared }

// String returns "bykey" or "shared".
func (a Assignment) String() string {
	switch a {
	case ByKey:
		return "bykey"
	case Shared:
		return "shared"
	}
	return fmt.Sprintf("Assignment(%d)", int(a))
}

// Result is what a handler returns for an item: Done or RetryAt. The zero
// Result is Done.
type Result struct {
	retry bool
	hold  bool
	at    time.Time
}

// Done reports that the item is finished; its key moves on.
func Done() Result { return Result{} }

// RetryAt keeps the item and delivers it again not before t (a zero or past t
// means as soon as possible). Under Ordered the item goes back to the head of
// its key, which is held until then; under Exclusive and Parallel it waits
// aside and later items of its key may run first. Other keys are never held.
func RetryAt(t time.Time) Result { return Result{retry: true, at: t} }

// WaitAt keeps an item that has not failed but may not run yet (a
// throttled one) and delivers it again not before t. Unlike RetryAt it
// keeps its key's order under Exclusive too: the item stays at the head of
// its key, which is held until then, under Exclusive and Ordered (only a
// failed item may be overtaken). Under Parallel it is RetryAt.
func WaitAt(t time.Time) Result { return Result{retry: true, hold: true, at: t} }

// Handler runs one item. key is "" and keyed false for keyless items. ctx is
// the pool's context: it is cancelled when Close's deadline passes.
//
// A Handler must not panic: the pool does not recover, so a panic ends the
// process as in any goroutine. Callers that run untrusted code recover inside
// the handler (the subscribe package does).
type Handler[T any] func(ctx context.Context, key string, keyed bool, v T) Result

// CapacityDefault is the default Config.Capacity.
const CapacityDefault = 1024

// Config configures a Pool. The zero value, like a nil *Config, gives the
// defaults.
type Config struct {
	// Workers is the number of lanes (ByKey) or of workers on the single
	// lane (Shared). Defaults to runtime.GOMAXPROCS(0); must not be
	// negative.
	Workers int
	// Assign decides which lane an item goes to. Defaults to Shared (the
	// zero value).
	Assign Assignment
	// Ordering is the delivery policy for items that share a key. Defaults
	// to policy.Ordered (the zero value); Parallel lifts the key rules.
	Ordering policy.Ordering
	// Capacity is the maximum number of waiting items per lane, not counting
	// those in flight; Submit blocks while the lane is full. Defaults to
	// CapacityDefault; must not be negative.
	Capacity int
	// Fair makes each lane serve fairness keys (Item.Fairness) round
	// robin instead of by arrival alone; see the package documentation.
	// Defaults to false: the oldest deliverable item goes first.
	Fair bool
	// FairWeight, with Fair, gives a fairness key's weight: how many items
	// it is served in a row in its turn (below 1 counts as 1). Nil gives
	// every fairness key weight 1.
	FairWeight func(fairKey string) int
}

// WithDefaults returns a copy of c (which may be nil) with zero fields set
// to their defaults.
func (c *Config) WithDefaults() *Config {
	if c == nil {
		c = &Config{}
	}
	return &Config{
		Workers:    cmp.Or(c.Workers, runtime.GOMAXPROCS(0)),
		Assign:     c.Assign,
		Ordering:   c.Ordering,
		Capacity:   cmp.Or(c.Capacity, CapacityDefault),
		Fair:       c.Fair,
		FairWeight: c.FairWeight,
	}
}

func (c *Config) validate() error {
	switch {
	case c.Workers < 0:
		return fmt.Errorf("lanes: Config.Workers must not be negative, got %d: %w", c.Workers, keyorder.ErrInvalidConfig)
	case !c.Assign.Valid():
		return fmt.Errorf("lanes: Config.Assign: unknown assignment %d: %w", int(c.Assign), keyorder.ErrInvalidConfig)
	case !c.Ordering.Valid():
		return fmt.Errorf("lanes: Config.Ordering: unknown ordering %d: %w", int(c.Ordering), keyorder.ErrInvalidConfig)
	case c.Capacity < 0:
		return fmt.Errorf("lanes: Config.Capacity must not be negative, got %d: %w", c.Capacity, keyorder.ErrInvalidConfig)
	}
	return nil
}

// Stats is a snapshot of a Pool's load.
type Stats struct {
	// Queued is the number of items waiting: not yet started, parked behind
	// their key, delayed, or handed back by RetryAt.
	Queued int
	// InFlight is the number of items whose handler is running.
	InFlight int
}

// Pool runs items on keyed worker lanes. Create it with New and stop it with
// Close, which also ends its goroutines; its methods are safe for concurrent
// use.
type Pool[T any] struct {
	handler  Handler[T]
	lanes    []*lane[T]
	capacity int
	seed     maphash.Seed
	rr       atomic.Uint64 // round-robin cursor for keyless items (ByKey)

	ctx     context.Context // handed to every handler
	cancel  context.CancelFunc
	closing chan struct{} // closed when Close starts: wakes blocked Submits
	stopped chan struct{} // closed when the last worker has returned
	live    atomic.Int64  // workers still running
	// stopping is set when Close starts; workers read it between the items
	// of a batch without taking the lane's lock.
	stopping atomic.Bool

	// inline counts the handlers running in callers' goroutines
	// (SubmitOrRun); Close waits for them as for the workers.
	inline sync.WaitGroup

	closeMu sync.Mutex
	closed  bool
}

// lane is one queue with its workers. Everything but space is guarded by mu.
//
// Waiting items are split in two, oldest first: q, the groupq.Queue that
// decides what is deliverable, and staged, a plain FIFO of newer items not
// yet handed to q (Submit only appends to staged). Workers move staged items
// into q only when q has nothing deliverable. Whether an item is deliverable
// depends only on older items of its group and on what is in flight, so the
// result is exactly that of one queue holding everything, while q stays small
// (a full lane would otherwise make each Pop walk heaps of Capacity entries).
//
// A lane with a single worker goes one step further (see workSingle): when
// q holds nothing and nothing is in flight, the oldest staged item is
// deliverable under every ordering, and so is the next one once it is done,
// so the worker takes a run of them at once without passing them through q.
type lane[T any] struct {
	mu     sync.Mutex
	ready  sync.Cond // workers wait here for a deliverable item
	q      *groupq.Queue[T]
	staged fifo[T]
	single bool // one worker (ByKey, or Shared with one worker)
	// workers is the lane's number of workers: the bound on the items in
	// flight in q, those run by callers (SubmitOrRun) included.
	workers int
	fair    bool // q serves fairness keys round robin; staged is moved in whole
	direct  int  // single: items of the worker's batch running (0 or 1)
	// held counts the items of the worker's batch not yet started (single
	// lanes). The worker lowers it as it starts each one, without the lock.
	held   atomic.Int64
	idle   int  // workers waiting on ready
	closed bool // no more Submits; workers stop taking items
	// waiters counts the Submits waiting for space. A waiter adds itself
	// before it checks for space and the worker lowers held before it
	// reads waiters, so one of the two sees the other.
	waiters atomic.Int64
	// space receives a token when a slot may have freed. With one slot of
	// buffer no token is lost; a stale token costs a waiter one recheck.
	space   chan struct{}
	timer   *time.Timer // wakes the workers at timerAt; created on first use
	timerAt time.Time   // zero when the timer is not armed
	_       [64]byte    // keep lanes off each other's cache lines
}

// New returns a running Pool that calls h for each submitted item. A nil cfg
// gives the defaults. An invalid configuration returns an error matching
// keyorder.ErrInvalidConfig that names the field.
func New[T any](cfg *Config, h Handler[T]) (*Pool[T], error) {
	if h == nil {
		return nil, fmt.Errorf("lanes: nil Handler: %w", keyorder.ErrInvalidConfig)
	}
	if cfg != nil {
		if err := cfg.validate(); err != nil {
			return nil, err
		}
	}
	c := cfg.WithDefaults()
	nlanes, perLane := c.Workers, 1
	if c.Assign == Shared {
		nlanes, perLane = 1, c.Workers
	}
	p := &Pool[T]{
		handler:  h,
		lanes:    make([]*lane[T], nlanes),
		capacity: c.Capacity,
		seed:     maphash.MakeSeed(),
		closing:  make(chan struct{}),
		stopped:  make(chan struct{}),
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	for i := range p.lanes {
		l := &lane[T]{q: groupq.New[T](c.Ordering), single: perLane == 1, workers: perLane, space: make(chan struct{}, 1)}
		if c.Fair {
			l.q, l.fair = groupq.NewFair[T](c.Ordering, c.FairWeight), true
		}
		l.ready.L = &l.mu
		p.lanes[i] = l
	}
	p.live.Store(int64(nlanes * perLane))
	for _, l := range p.lanes {
		for range perLane {
			go p.work(l)
		}
	}
	return p, nil
}

// laneFor picks the lane of an item.
func (p *Pool[T]) laneFor(key string, keyed bool) *lane[T] {
	return p.lanes[p.laneIndex(key, keyed)]
}

// laneIndex is the index of laneFor's lane.
func (p *Pool[T]) laneIndex(key string, keyed bool) int {
	n := uint64(len(p.lanes))
	if n == 1 {
		return 0
	}
	if keyed {
		return int(maphash.String(p.seed, key) % n)
	}
	return int(p.rr.Add(1) % n)
}

// Item says where a submitted value goes and when it may run. The zero
// Item is a keyless item that may run now.
type Item struct {
	// Key is the item's ordering key; it is ignored unless Keyed.
	Key string
	// Keyed reports whether the item belongs to the group Key. A keyless
	// item belongs to no group and runs whenever a worker is free.
	Keyed bool
	// NotBefore is the earliest time the item may run (zero: now). Under
	// Ordered a not-yet-due item holds its key until then; under Exclusive
	// and Parallel later items of its key may run first.
	NotBefore time.Time
	// Fairness is the item's fairness key (a tenant, for example): in a
	// pool with Config.Fair each lane serves fairness keys round robin (see
	// the package documentation). Without Config.Fair it is ignored.
	Fairness string
}

// Submit queues v on its lane, as it says (see Item).
//
// Submit blocks while the lane already holds Config.Capacity waiting items;
// if ctx ends first it returns ctx.Err() (a Submit that finds room does not
// look at ctx). Once Close has started it returns keyorder.ErrClosed.
//
// A handler may call Submit, but if it blocks on a full lane whose workers
// are all inside such calls, nothing frees space: give it a ctx that ends.
func (p *Pool[T]) Submit(ctx context.Context, it Item, v T) error {
	key, keyed, notBefore := it.Key, it.Keyed, it.NotBefore
	if !keyed {
		key = ""
	}
	if !notBefore.IsZero() && !notBefore.After(time.Now()) {
		notBefore = time.Time{}
	}
	l := p.laneFor(key, keyed)
	l.mu.Lock()
	if l.waiting() >= p.capacity {
		if err := p.waitSpace(ctx, l); err != nil {
			l.mu.Unlock()
			return err
		}
	}
	if l.closed {
		l.mu.Unlock()
		return keyorder.ErrClosed
	}
	l.staged.push(groupq.Item[T]{Key: key, Keyed: keyed, At: notBefore, Value: v, Fair: it.Fairness})
	if l.idle > 0 {
		// The woken worker takes the item, or files it in q (which then
		// knows when a delayed item is due) before it waits again.
		l.ready.Signal()
	}
	if l.waiters.Load() > 0 && l.waiting() < p.capacity {
		l.notifySpace() // pass the baton to the next waiting Submit
	}
	l.mu.Unlock()
	return nil
}

// SubmitAll queues several items: vs[i] as its[i] says, in order, with
// the result of calling Submit for each in turn and stopping at the first
// error. It returns how many it queued (a prefix: vs[:n]) and the error
// that stopped it. When every lane it touches has room for its share and
// is open, it queues them all with one lock per lane and wakes each lane's
// idle workers once, rather than locking and waking per item (the
// subscribe package hands it each received batch). Otherwise it falls
// back to Submit per item, blocking on a full lane as Submit does. its and
// vs must have the same length; SubmitAll panics otherwise.
func (p *Pool[T]) SubmitAll(ctx context.Context, its []Item, vs []T) (int, error) {
	if len(its) != len(vs) {
		panic("lanes: SubmitAll: its and vs differ in length")
	}
	if len(its) <= 1 || len(p.lanes) > maxAllLanes {
		return p.submitEach(ctx, its, vs, 0)
	}
	var idxBuf [1024]uint8 // batches up to this size allocate nothing
	var countBuf [maxAllLanes]int32
	idx := idxBuf[:0]
	if len(its) > len(idxBuf) {
		idx = make([]uint8, 0, len(its))
	}
	count := countBuf[:len(p.lanes)]
	var now time.Time
	for i := range its {
		li := p.laneIndex(its[i].Key, its[i].Keyed)
		idx = append(idx, uint8(li))
		count[li]++
		if now.IsZero() && !its[i].NotBefore.IsZero() {
			now = time.Now()
		}
	}
	// Lock the lanes in order (Close locks one lane at a time), and queue
	// nothing unless all of them take their share now.
	for li, c := range count {
		if c == 0 {
			continue
		}
		l := p.lanes[li]
		l.mu.Lock()
		if l.closed || l.waiting()+int(c) > p.capacity {
			for lj := li; lj >= 0; lj-- {
				if count[lj] > 0 {
					p.lanes[lj].mu.Unlock()
				}
			}
			return p.submitEach(ctx, its, vs, 0)
		}
	}
	for i := range its {
		it := &its[i]
		key, notBefore := it.Key, it.NotBefore
		if !it.Keyed {
			key = ""
		}
		if !notBefore.IsZero() && !notBefore.After(now) {
			notBefore = time.Time{}
		}
		p.lanes[idx[i]].staged.push(groupq.Item[T]{Key: key, Keyed: it.Keyed, At: notBefore, Value: vs[i], Fair: it.Fairness})
	}
	for li, c := range count {
		if c == 0 {
			continue
		}
		l := p.lanes[li]
		// As Submit does per item: each item may be one idle worker's.
		for range min(int(c), l.idle) {
			l.ready.Signal()
		}
		if l.waiters.Load() > 0 && l.waiting() < p.capacity {
			l.notifySpace()
		}
		l.mu.Unlock()
	}
	return len(its), nil
}

// maxAllLanes bounds the pools whose SubmitAll locks every lane it
// touches at once (lane indexes fit a byte); larger pools submit item by
// item.
const maxAllLanes = 256

// submitEach submits its[from:] one by one, stopping at the first error.
func (p *Pool[T]) submitEach(ctx context.Context, its []Item, vs []T, from int) (int, error) {
	for i := from; i < len(its); i++ {
		if err := p.Submit(ctx, its[i], vs[i]); err != nil {
			return i, err
		}
	}
	return len(its), nil
}

// SubmitOrRun is Submit, except that an item that can start at once runs
// in the calling goroutine: SubmitOrRun then calls the handler itself and
// returns after it (ran reports true), saving the hand-off to a worker and
// back. It can start at once when nothing its lane holds could start
// instead (every waiting item waits for its key or its time), fewer items
// are in flight than the lane has workers (the caller takes a worker's
// place, so Config.Workers still bounds the handlers running at once), and
// its key does not hold it (under Exclusive and Ordered an item of the key
// in flight; under Ordered one waiting for a retry), and it is due (its
// NotBefore is not in the future).
// Otherwise (and always in a pool with Config.Fair) the item is queued
// exactly as Submit queues it (ran is false), waiting for room while the
// lane holds Config.Capacity waiting items, and a worker runs it in its
// turn. Either way the item takes its place in
// its key's order as of the call, as with Submit: an item of the key
// submitted later never runs before it.
//
// The handler gets the pool's context, as on a worker. If it returns
// RetryAt or WaitAt, the item goes back to its lane as it would from a
// worker, and a worker runs it again. SubmitOrRun returns
// keyorder.ErrClosed once Close has started; Close waits for the handlers
// running in callers' goroutines too.
func (p *Pool[T]) SubmitOrRun(ctx context.Context, it Item, v T) (ran bool, err error) {
	if !it.NotBefore.IsZero() && it.NotBefore.After(time.Now()) {
		return false, p.Submit(ctx, it, v)
	}
	key, keyed := it.Key, it.Keyed
	if !keyed {
		key = ""
	}
	l := p.laneFor(key, keyed)
	// The caller's goroutine is often a fresh one, with the smallest
	// stack: the handle lives in this frame, and the rarer work is done in
	// calls of their own, so that the handler starts without growing it.
	h := groupq.Handle[T]{Item: groupq.Item[T]{Key: key, Keyed: keyed, Value: v, Fair: it.Fairness}}
	if s := l.startInline(&h, &p.inline, p.capacity); s != inlineStarted {
		return p.notInline(ctx, s, &h.Item)
	}
	settled := false
	defer p.endInline(l, &h, &settled)
	r := p.handler(p.ctx, h.Item.Key, h.Item.Keyed, h.Item.Value)
	l.settleInline(&h, r)
	settled = true
	return true, nil
}

// endInline ends a SubmitOrRun that ran its item. If the handler panicked
// (which a Handler must not do) and the caller may recover, it settles the
// item as done rather than leave its key held for ever.
func (p *Pool[T]) endInline(l *lane[T], h *groupq.Handle[T], settled *bool) {
	if !*settled {
		l.settleInline(h, Done())
	}
	p.inline.Done()
}

// notInline finishes a SubmitOrRun whose item startInline did not start.
//
//go:noinline
func (p *Pool[T]) notInline(ctx context.Context, s inlineStart, it *groupq.Item[T]) (bool, error) {
	switch s {
	case inlineClosed:
		return false, keyorder.ErrClosed
	case inlineQueued:
		return false, nil
	}
	return false, p.Submit(ctx, Item{Key: it.Key, Keyed: it.Keyed, Fairness: it.Fair}, it.Value)
}

// inlineStart is what startInline did with an item.
type inlineStart int

const (
	inlineStarted inlineStart = iota // handed out in h: the caller runs it
	inlineQueued                     // waiting in q behind its key
	inlineNot                        // not started: Submit it
	inlineClosed                     // the pool is closing
)

// startInline hands h.Item out, to be run by the caller, if it can start
// at once (see SubmitOrRun), counting it in running; if its key holds it,
// it queues it in q behind the key when the lane has room for it (fewer
// than capacity items waiting), else leaves it to Submit, which waits for
// room as it would for any item.
func (l *lane[T]) startInline(h *groupq.Handle[T], running *sync.WaitGroup, capacity int) inlineStart {
	l.mu.Lock()
	s := inlineNot
	switch {
	case l.closed:
		s = inlineClosed
	case l.fair || l.staged.len() > 0 || l.held.Load() > 0 || l.direct > 0 || l.q.InFlight() >= l.workers:
	case l.q.Len() > 0 && l.othersDeliverable():
	case l.q.Start(h):
		running.Add(1) // under l.mu, before Close can see the lane closed
		s = inlineStarted
	case l.waiting() >= capacity:
		// Its key holds it and the lane is full: Submit waits for room.
	default:
		// Its key holds it (an item of the key in flight or, under
		// Ordered, parked): it waits in q, and whoever settles the key's
		// item wakes a worker for it (see settleInline and work).
		l.pushItem(&h.Item)
		s = inlineQueued
	}
	l.mu.Unlock()
	return s
}

// othersDeliverable reports, with l.mu held, whether an item waiting in q
// could start now; then an item that SubmitOrRun is given must not go
// first.
//
//go:noinline
func (l *lane[T]) othersDeliverable() bool {
	// groupq needs the time only for parked or delayed items.
	var now time.Time
	if _, ok := l.q.NextWake(); ok {
		now = time.Now()
	}
	return l.q.Deliverable(now)
}

// pushItem queues *it in q, with l.mu held.
//
//go:noinline
func (l *lane[T]) pushItem(it *groupq.Item[T]) { l.q.Push(*it) }

// settleInline records the result of an item a caller ran (SubmitOrRun).
// The common case (done, nothing else waiting) stays in small frames.
func (l *lane[T]) settleInline(h *groupq.Handle[T], r Result) {
	l.mu.Lock()
	if r.retry {
		l.settleInlineSlow(h, r)
	} else {
		l.q.Finish(h)
		if l.idle > 0 && l.waiting() > 0 {
			l.wakeIdle()
		}
	}
	l.mu.Unlock()
}

// settleInlineSlow settles a retried item, with l.mu held.
//
//go:noinline
func (l *lane[T]) settleInlineSlow(h *groupq.Handle[T], r Result) {
	l.settle(*h, r)
	if l.idle > 0 {
		l.wakeIdle()
	}
}

// wakeIdle wakes an idle worker after an item a caller ran was settled,
// with l.mu held: Done or Retry can make one item deliverable, a worker
// may have waited for this caller's place, and delayed items (a retried
// one; a key's next item with a not-before time) need the timer. With
// nothing waiting there is nothing to do.
//
//go:noinline
func (l *lane[T]) wakeIdle() {
	l.arm()
	if l.waiting() > 0 {
		l.ready.Signal()
	}
}

// waitSpace waits, with l.mu held, until l has room or is closed. It returns
// ctx.Err() if ctx ends first.
func (p *Pool[T]) waitSpace(ctx context.Context, l *lane[T]) error {
	l.waiters.Add(1)
	defer l.waiters.Add(-1)
	for l.waiting() >= p.capacity && !l.closed {
		l.mu.Unlock()
		var err error
		select {
		case <-l.space:
		case <-p.closing:
		case <-ctx.Done():
			err = ctx.Err()
		}
		l.mu.Lock()
		if err != nil {
			if l.waiters.Load() > 1 && l.waiting() < p.capacity {
				l.notifySpace() // the token may have been meant for us
			}
			return err
		}
	}
	return nil
}

// waiting returns the number of waiting items of l.
func (l *lane[T]) waiting() int { return l.q.Len() + l.staged.len() + int(l.held.Load()) }

// take hands out the oldest deliverable item, moving staged items into q as
// long as q has none deliverable. timed reports whether due delayed items
// may have been released, which another worker might take. If take fails,
// staged is empty.
func (l *lane[T]) take() (h groupq.Handle[T], ok, timed bool) {
	// groupq needs the time only for parked or delayed items.
	var now time.Time
	if _, ok := l.q.NextWake(); ok {
		now = time.Now()
	}
	if l.fair {
		// Fairness chooses among everything waiting, so nothing stays
		// staged.
		for l.staged.len() > 0 {
			it := l.staged.pop()
			if !it.At.IsZero() && now.IsZero() {
				now = time.Now()
			}
			l.q.Push(it)
		}
		h, ok = l.q.Pop(now)
		return h, ok, ok && !now.IsZero()
	}
	for {
		if l.q.Len() > 0 {
			if h, ok := l.q.Pop(now); ok {
				return h, true, !now.IsZero()
			}
		}
		if l.staged.len() == 0 {
			return h, false, false
		}
		it := l.staged.pop()
		if !it.At.IsZero() && now.IsZero() {
			now = time.Now()
		}
		l.q.Push(it)
	}
}

// retryTime returns when a retried item is due; zero means now.
func (r Result) retryTime() time.Time {
	if !r.at.IsZero() && !r.at.After(time.Now()) {
		return time.Time{}
	}
	return r.at
}

// settle records the handler's result for h, with l.mu held.
func (l *lane[T]) settle(h groupq.Handle[T], r Result) {
	if r.retry {
		h.Item.Hold = r.hold
		l.q.Retry(h, r.retryTime())
	} else {
		l.q.Done(h)
	}
}

func (l *lane[T]) notifySpace() {
	select {
	case l.space <- struct{}{}:
	default:
	}
}

// arm makes sure, with l.mu held, that the timer fires no later than the
// earliest time a waiting item becomes due. The timer is only ever moved
// earlier, so a pending wake-up is never lost.
func (l *lane[T]) arm() {
	wake, ok := l.q.NextWake()
	if !ok || l.closed || (!l.timerAt.IsZero() && !wake.Before(l.timerAt)) {
		return
	}
	l.timerAt = wake
	d := time.Until(wake)
	if l.timer == nil {
		l.timer = time.AfterFunc(d, l.fire)
		return
	}
	l.timer.Reset(d)
}

// fire wakes every idle worker of the lane: some item became due.
func (l *lane[T]) fire() {
	l.mu.Lock()
	l.timerAt = time.Time{}
	l.ready.Broadcast()
	l.mu.Unlock()
}

// work is the loop of one worker of l.
func (p *Pool[T]) work(l *lane[T]) {
	defer func() {
		if p.live.Add(-1) == 0 {
			close(p.stopped)
		}
	}()
	if l.single {
		p.workSingle(l)
		return
	}
	l.mu.Lock()
	for {
		h, ok := l.next()
		if !ok {
			break
		}
		l.mu.Unlock()
		r := p.handler(p.ctx, h.Item.Key, h.Item.Keyed, h.Item.Value)
		l.mu.Lock()
		l.settle(h, r)
		// Done or Retry can make at most one item deliverable, and this
		// worker takes the oldest next; idle workers only need the timer
		// for items that are now parked or delayed.
		if l.idle > 0 {
			l.arm()
		}
	}
	l.mu.Unlock()
}

// next takes the oldest deliverable item of l, waiting for one with l.mu
// held. It returns false once the lane is closed.
func (l *lane[T]) next() (groupq.Handle[T], bool) {
	for !l.closed {
		// Items run by callers (SubmitOrRun) take workers' places.
		if l.q.InFlight() >= l.workers {
			l.idle++
			l.ready.Wait()
			l.idle--
			continue
		}
		if h, ok, timed := l.take(); ok {
			if l.waiters.Load() > 0 {
				l.notifySpace()
			}
			if l.idle > 0 {
				// take may have filed delayed items in q, or released
				// several due ones at once.
				l.arm()
				if timed && l.waiting() > 0 {
					l.ready.Signal()
				}
			}
			return h, true
		}
		l.arm()
		l.idle++
		l.ready.Wait()
		l.idle--
	}
	return groupq.Handle[T]{}, false
}

// batchMax bounds the run of items a single-worker lane takes at once.
const batchMax = 32

// workSingle is the loop of the only worker of l. When q is empty, no item
// of l is in flight, so the oldest staged item is deliverable under every
// ordering, and after it is done the next one is too. The worker then takes
// a run of such items (stopping before a delayed one) with one lock, and
// runs them in order. If one is retried, or Close starts, it stops there:
// the retried item goes into q, where nothing else can have arrived
// meanwhile, so it gets exactly the place groupq's Retry would give it
// (before every staged item), and the items not started go back to the
// front of staged. The result is the same as taking the items one by one.
func (p *Pool[T]) workSingle(l *lane[T]) {
	batch := make([]groupq.Item[T], 0, batchMax)
	l.mu.Lock()
	for !l.closed {
		// A fair lane never takes the fast path: it would serve staged
		// items by arrival.
		// Nor while a caller runs an item (SubmitOrRun): it is in flight
		// in q, and might share a key with the staged items.
		if l.fair || l.q.Len() > 0 || l.q.InFlight() > 0 || l.staged.len() == 0 || !l.staged.front().At.IsZero() {
			h, ok := l.next()
			if !ok {
				break
			}
			l.mu.Unlock()
			r := p.handler(p.ctx, h.Item.Key, h.Item.Keyed, h.Item.Value)
			l.mu.Lock()
			l.settle(h, r)
			continue
		}
		for len(batch) < batchMax && l.staged.len() > 0 && l.staged.front().At.IsZero() {
			batch = append(batch, l.staged.pop())
		}
		// Until they start, the items of the batch count as waiting, so a
		// lane never holds more than Capacity items not started.
		l.direct = 1
		l.held.Store(int64(len(batch) - 1))
		if l.waiters.Load() > 0 {
			l.notifySpace()
		}
		l.mu.Unlock()
		var r Result
		n := 0
		for n < len(batch) {
			if n > 0 {
				l.held.Add(-1)
				if l.waiters.Load() > 0 {
					l.notifySpace()
				}
			}
			it := &batch[n]
			r = p.handler(p.ctx, it.Key, it.Keyed, it.Value)
			n++
			if r.retry || p.stopping.Load() {
				break
			}
		}
		l.mu.Lock()
		l.direct = 0
		l.held.Store(0)
		if r.retry {
			it := batch[n-1]
			it.At, it.Hold = r.retryTime(), r.hold
			l.q.Push(it)
		}
		for i := len(batch) - 1; i >= n; i-- {
			l.staged.pushFront(batch[i])
		}
		clear(batch)
		batch = batch[:0]
		if l.waiters.Load() > 0 && l.waiting() < p.capacity {
			l.notifySpace()
		}
	}
	l.mu.Unlock()
}

// Close stops the pool. It stops admitting items (Submit returns
// keyorder.ErrClosed, including Submits blocked on a full lane), workers stop
// taking new items, and Close waits for running handlers to return. If ctx
// ends first, Close cancels the handlers' context, still waits for them to
// return, and reports ctx.Err().
//
// It then returns every item still waiting — never started, parked behind
// its key, delayed, or handed back by RetryAt — oldest first within each
// lane, lane after lane. A second Close returns nil, keyorder.ErrClosed.
func (p *Pool[T]) Close(ctx context.Context) (leftover []T, err error) {
	p.closeMu.Lock()
	if p.closed {
		p.closeMu.Unlock()
		return nil, keyorder.ErrClosed
	}
	p.closed = true
	p.closeMu.Unlock()
	p.stopping.Store(true)

	for _, l := range p.lanes {
		l.mu.Lock()
		l.closed = true
		if l.timer != nil {
			l.timer.Stop()
			l.timerAt = time.Time{}
		}
		l.ready.Broadcast()
		l.mu.Unlock()
	}
	close(p.closing)

	stopped := make(chan struct{})
	go func() {
		<-p.stopped
		p.inline.Wait()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-ctx.Done():
		p.cancel()
		<-stopped
		err = ctx.Err()
	}
	p.cancel()

	for _, l := range p.lanes {
		l.mu.Lock()
		for _, it := range l.q.Drain() {
			leftover = append(leftover, it.Value)
		}
		for l.staged.len() > 0 {
			leftover = append(leftover, l.staged.pop().Value)
		}
		l.mu.Unlock()
	}
	return leftover, err
}

// Stats returns a snapshot of the pool's load. It takes each lane's lock
// briefly and allocates nothing.
func (p *Pool[T]) Stats() Stats {
	var s Stats
	for _, l := range p.lanes {
		l.mu.Lock()
		s.Queued += l.waiting()
		s.InFlight += l.q.InFlight() + l.direct
		l.mu.Unlock()
	}
	return s
}

// fifo is a growable ring of items; its length is a power of two. It grows
// only while a lane fills up for the first time, so the steady state does not
// allocate.
type fifo[T any] struct {
	buf  []groupq.Item[T]
	head int
	n    int
}

func (f *fifo[T]) len() int { return f.n }

func (f *fifo[T]) push(it groupq.Item[T]) {
	if f.n == len(f.buf) {
		f.grow()
	}
	f.buf[(f.head+f.n)&(len(f.buf)-1)] = it
	f.n++
}

func (f *fifo[T]) front() *groupq.Item[T] { return &f.buf[f.head] }

func (f *fifo[T]) grow() {
	buf := make([]groupq.Item[T], max(16, 2*len(f.buf)))
	k := copy(buf, f.buf[f.head:])
	copy(buf[k:], f.buf[:f.head])
	f.buf, f.head = buf, 0
}

// pushFront puts it back before the oldest item.
func (f *fifo[T]) pushFront(it groupq.Item[T]) {
	if f.n == len(f.buf) {
		f.grow()
	}
	f.head = (f.head - 1) & (len(f.buf) - 1)
	f.buf[f.head] = it
	f.n++
}

func (f *fifo[T]) pop() groupq.Item[T] {
	it := f.buf[f.head]
	f.buf[f.head] = groupq.Item[T]{}
	f.head = (f.head + 1) & (len(f.buf) - 1)
	f.n--
	return it
}
