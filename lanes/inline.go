package lanes

// This file: SubmitOrRun, which runs an item that can start at once in the
// caller's goroutine.

import (
	"context"
	"sync"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/internal/groupq"
)

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
