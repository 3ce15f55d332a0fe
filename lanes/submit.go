package lanes

// This file: admission: Item, Submit and SubmitAll.

import (
	"context"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/internal/groupq"
)

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
