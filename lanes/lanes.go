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
