package lanes

// This file: the workers' loops: the shared one over groupq, and a single-
// worker lane's runs of staged items.

import (
	"github.com/keyorder/keyorder/internal/groupq"
)

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
