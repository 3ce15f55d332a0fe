package lanes

// This file: one lane: its queue (groupq plus a staged FIFO), the wait for
// room, the timer for delayed items, and the handing-out of the oldest
// deliverable item.

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyorder/keyorder/internal/groupq"
)

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
		if it.At.IsZero() {
			// Nothing in q is deliverable, so this oldest staged item is
			// the next one if its key lets it start (nothing of the key
			// queued or in flight): it starts at once, without a trip
			// through q's heaps.
			h = groupq.Handle[T]{Item: it}
			if l.q.Start(&h) {
				return h, true, !now.IsZero()
			}
		} else if now.IsZero() {
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
