// Package groupq is the scheduling core shared by the keyed worker lanes and
// the in-memory broker: a queue of items that belong to ordering groups, which
// hands out the oldest deliverable item under a policy.Ordering.
//
// An item of a group is deliverable when nothing of its group is in flight
// and (under Ordered) it is the oldest pending item of its group and its
// not-before time has passed; an item without a group, or any item under
// Parallel, is deliverable once its not-before time has passed. Pop takes the
// oldest deliverable item (by arrival). Under Ordered a retried item goes back
// to the head of its group and holds the group until its retry time; under
// Exclusive and Parallel it waits aside and later items may run first.
//
// # Fairness
//
// A queue made with NewFair chooses among fairness keys (Item.Fair) round
// robin, optionally weighted, instead of by arrival alone: each Pop serves
// the next fairness key that has something deliverable, and within one
// fairness key the oldest deliverable item. What is deliverable does not
// change, so ordering wins over fairness, as the table in the ordering
// design says:
//
//   - a group that lies within one fairness key (the ordering key includes
//     the fairness key): fairness has no effect on the group's order;
//   - a group that spans fairness keys: the group is served in its own
//     order; its head decides the fairness key it competes under, so the
//     group's next item waits for the head even when its own fairness key
//     would be next;
//   - everything in one group (whole-queue order): only one item is ever
//     deliverable, so arrival order decides.
//
// A Queue is not safe for concurrent use; callers hold their own lock. Time is
// passed in, never read, so callers can drive it with any clock. Steady-state
// operations do not allocate.
package groupq

import (
	"slices"
	"time"

	"github.com/keyorder/keyorder/policy"
)

// Item is one queued element.
type Item[T any] struct {
	// Key is the ordering key; meaningful when Keyed.
	Key string
	// Keyed reports whether the item belongs to the group Key.
	Keyed bool
	// At is the not-before time; zero means now.
	At time.Time
	// Seq is the arrival order, assigned by Push.
	Seq uint64
	// Value is the caller's payload.
	Value T
	// Fair is the fairness key, used by a queue made with NewFair; "" is a
	// fairness key like any other.
	Fair string
	// Hold makes a keyed item waiting on At keep its place at the head of
	// its group and hold the group until then under Exclusive too, as
	// every waiting item does under Ordered. It is for an item that has
	// not failed and only waits its turn (a throttled one): under
	// Exclusive only a failed item may be overtaken by later ones.
	// Ignored under Parallel, where items have no group.
	Hold bool
}

// Handle identifies an item handed out by Pop until it is settled with Done,
// Retry or Release.
type Handle[T any] struct {
	Item Item[T]
	ks   *keyState[T]
	gen  uint64
}

type keyState[T any] struct {
	key      string
	pending  []Item[T] // pending[head:] sorted by Seq
	head     int
	inflight int
	readyIdx int                  // index in ready heap, -1 if absent
	headSeq  uint64               // front().Seq while in a ready heap: its order there
	in       *bheap[*keyState[T]] // the ready heap holding it, when readyIdx >= 0
	timedAt  time.Time
	gen      uint64
}

func (k *keyState[T]) len() int        { return len(k.pending) - k.head }
func (k *keyState[T]) front() *Item[T] { return &k.pending[k.head] }

func (k *keyState[T]) popFront() Item[T] {
	it := k.pending[k.head]
	var zero Item[T]
	k.pending[k.head] = zero
	k.head++
	if k.head == len(k.pending) {
		k.pending = k.pending[:0]
		k.head = 0
	}
	return it
}

// insert places it by Seq (usually at the back).
func (k *keyState[T]) insert(it Item[T]) {
	if k.len() == 0 || k.pending[len(k.pending)-1].Seq < it.Seq {
		k.pending = append(k.pending, it)
		return
	}
	if k.head > 0 {
		n := copy(k.pending, k.pending[k.head:])
		clear(k.pending[n:])
		k.pending = k.pending[:n]
		k.head = 0
	}
	i, _ := slices.BinarySearchFunc(k.pending, it.Seq, func(a Item[T], s uint64) int {
		switch {
		case a.Seq < s:
			return -1
		case a.Seq > s:
			return 1
		}
		return 0
	})
	k.pending = slices.Insert(k.pending, i, it)
}

type timedEntry[T any] struct {
	at   time.Time
	ks   *keyState[T] // a parked group (Ordered), or nil for a delayed item
	gen  uint64
	item Item[T]
}

// fairState is one fairness key's deliverable items (fair queues only).
type fairState[T any] struct {
	name       string
	ready      bheap[*keyState[T]] // groups whose head has this fairness key
	free       bheap[Item[T]]
	prev, next *fairState[T] // the ring of fairness keys, while linked
	linked     bool
	served     int // items handed out in its current turn
}

func (f *fairState[T]) empty() bool { return len(f.ready.s) == 0 && len(f.free.s) == 0 }

// Queue is a group-aware queue. The zero value is not usable; call New.
type Queue[T any] struct {
	ordering policy.Ordering
	// Fair queues only: the deliverable items by fairness key, the ring
	// of fairness keys with something deliverable (cur is served next)
	// and each key's weight.
	fair      bool
	fairs     map[string]*fairState[T]
	cur       *fairState[T]
	weight    func(string) int
	fairSpare []*fairState[T]
	seq       uint64
	keys      map[string]*keyState[T]
	ready     bheap[*keyState[T]]
	free      bheap[Item[T]]
	timed     bheap[timedEntry[T]]
	spare     []*keyState[T]
	queued    int
	inflight  int
}

// New returns an empty queue enforcing ordering.
func New[T any](ordering policy.Ordering) *Queue[T] {
	q := &Queue[T]{ordering: ordering, keys: make(map[string]*keyState[T])}
	q.ready.less = func(a, b *keyState[T]) bool { return a.headSeq < b.headSeq }
	q.ready.moved = func(ks *keyState[T], i int) { ks.readyIdx = i }
	q.free.less = func(a, b Item[T]) bool { return a.Seq < b.Seq }
	q.timed.less = func(a, b timedEntry[T]) bool {
		if a.at.Equal(b.at) {
			return a.item.Seq < b.item.Seq
		}
		return a.at.Before(b.at)
	}
	return q
}

// NewFair returns an empty queue enforcing ordering that serves fairness
// keys (Item.Fair) round robin: see the package documentation. weight, if
// not nil, gives a fairness key's weight: the number of items it is served
// in a row in its turn (values below 1 count as 1). A nil weight serves
// every fairness key one item per turn.
func NewFair[T any](ordering policy.Ordering, weight func(fairKey string) int) *Queue[T] {
	q := New[T](ordering)
	q.fair = true
	q.fairs = make(map[string]*fairState[T])
	q.weight = weight
	return q
}

// Fair reports whether the queue serves fairness keys round robin.
func (q *Queue[T]) Fair() bool { return q.fair }

// fairFor returns the fairness key's state, linked into the ring (last in
// the current round) if it was not.
func (q *Queue[T]) fairFor(name string) *fairState[T] {
	fs := q.fairs[name]
	if fs == nil {
		if n := len(q.fairSpare); n > 0 {
			fs = q.fairSpare[n-1]
			q.fairSpare = q.fairSpare[:n-1]
		} else {
			fs = &fairState[T]{}
			fs.ready.less, fs.ready.moved = q.ready.less, q.ready.moved
			fs.free.less = q.free.less
		}
		fs.name = name
		q.fairs[name] = fs
	}
	if !fs.linked {
		fs.linked = true
		fs.served = 0
		if q.cur == nil {
			fs.prev, fs.next = fs, fs
			q.cur = fs
		} else {
			fs.prev, fs.next = q.cur.prev, q.cur
			q.cur.prev.next = fs
			q.cur.prev = fs
		}
	}
	return fs
}

// unlinkFair takes an empty fairness key out of the ring and forgets it.
func (q *Queue[T]) unlinkFair(fs *fairState[T]) {
	if fs.next == fs {
		q.cur = nil
	} else {
		fs.prev.next = fs.next
		fs.next.prev = fs.prev
		if q.cur == fs {
			q.cur = fs.next
		}
	}
	fs.prev, fs.next, fs.linked = nil, nil, false
	delete(q.fairs, fs.name)
	fs.name = ""
	q.fairSpare = append(q.fairSpare, fs)
}

// readyFor returns the ready heap a deliverable group belongs in.
func (q *Queue[T]) readyFor(ks *keyState[T]) *bheap[*keyState[T]] {
	if !q.fair {
		return &q.ready
	}
	return &q.fairFor(ks.front().Fair).ready
}

// pushFree files a deliverable item without a group.
func (q *Queue[T]) pushFree(it Item[T]) {
	if !q.fair {
		q.free.push(it)
		return
	}
	q.fairFor(it.Fair).free.push(it)
}

// unready takes a group out of the ready heap it is in, if any.
func (ks *keyState[T]) unready() {
	if ks.readyIdx >= 0 {
		ks.in.remove(ks.readyIdx)
	}
}

// Ordering returns the queue's ordering.
func (q *Queue[T]) Ordering() policy.Ordering { return q.ordering }

// Len returns the number of items waiting (not in flight).
func (q *Queue[T]) Len() int { return q.queued }

// InFlight returns the number of items handed out and not yet settled.
func (q *Queue[T]) InFlight() int { return q.inflight }

func (q *Queue[T]) grouped(it *Item[T]) bool { return it.Keyed && q.ordering.Keyed() }

// Push adds an item; it is assigned the next sequence number, which it
// returns.
func (q *Queue[T]) Push(it Item[T]) uint64 {
	q.seq++
	it.Seq = q.seq
	q.queued++
	q.place(it)
	return it.Seq
}

// place files a waiting item where it belongs.
func (q *Queue[T]) place(it Item[T]) {
	switch {
	case q.grouped(&it) && (q.ordering == policy.Ordered || it.Hold):
		ks := q.keyState(it.Key)
		ks.insert(it)
		q.settle(ks, time.Time{})
	case !it.At.IsZero():
		q.timed.push(timedEntry[T]{at: it.At, item: it})
	case q.grouped(&it):
		ks := q.keyState(it.Key)
		ks.insert(it)
		q.settle(ks, time.Time{})
	default:
		q.pushFree(it)
	}
}

func (q *Queue[T]) keyState(key string) *keyState[T] {
	if ks, ok := q.keys[key]; ok {
		return ks
	}
	var ks *keyState[T]
	if n := len(q.spare); n > 0 {
		ks = q.spare[n-1]
		q.spare = q.spare[:n-1]
	} else {
		ks = &keyState[T]{readyIdx: -1}
	}
	ks.key = key
	q.keys[key] = ks
	return ks
}

// settle re-files a group after a change. A zero now means "unknown": a head
// with a not-before time is parked and checked on the next Pop.
func (q *Queue[T]) settle(ks *keyState[T], now time.Time) {
	if ks.inflight > 0 || ks.len() == 0 {
		ks.unready()
		if ks.inflight == 0 && ks.len() == 0 && ks.timedAt.IsZero() {
			q.forget(ks)
		}
		return
	}
	if h := ks.front(); !h.At.IsZero() && (now.IsZero() || h.At.After(now)) {
		ks.unready()
		if !ks.timedAt.Equal(h.At) {
			ks.timedAt = h.At
			q.timed.push(timedEntry[T]{at: h.At, ks: ks, gen: ks.gen})
		}
		return
	}
	ks.headSeq = ks.front().Seq
	r := q.readyFor(ks)
	if ks.readyIdx >= 0 && ks.in == r {
		r.fix(ks.readyIdx)
		return
	}
	ks.unready()
	ks.in = r
	r.push(ks)
}

// advance moves everything whose time has come out of the timed heap.
func (q *Queue[T]) advance(now time.Time) {
	for len(q.timed.s) > 0 && !q.timed.s[0].at.After(now) {
		e := q.timed.pop()
		if e.ks == nil {
			e.item.At = time.Time{}
			if q.grouped(&e.item) {
				ks := q.keyState(e.item.Key)
				ks.insert(e.item)
				q.settle(ks, now)
			} else {
				q.pushFree(e.item)
			}
			continue
		}
		if e.ks.gen != e.gen || !e.ks.timedAt.Equal(e.at) {
			continue // stale
		}
		e.ks.timedAt = time.Time{}
		if e.ks.len() > 0 && !e.ks.front().At.After(now) {
			e.ks.front().At = time.Time{}
		}
		q.settle(e.ks, now)
	}
}

// Start hands out h.Item at once without queueing it, as Push followed by
// Pop would if nothing else were deliverable, filling in the rest of h.
// It is false, and the queue unchanged, when the item's group holds it (an
// item of the group in flight or waiting), when it has a not-before time
// (At), and in a fair queue: Push it then. Start does not look at other
// groups: a caller that keeps arrival order across groups checks
// Deliverable first. (The item is passed in h, not by value, to keep the
// caller's stack small.)
func (q *Queue[T]) Start(h *Handle[T]) bool {
	if q.fair || !h.Item.At.IsZero() {
		return false
	}
	h.ks, h.gen = nil, 0
	if q.grouped(&h.Item) {
		if ks := q.keys[h.Item.Key]; ks != nil && (ks.inflight > 0 || ks.len() > 0) {
			return false
		}
		ks := q.keyState(h.Item.Key)
		ks.inflight++
		h.ks, h.gen = ks, ks.gen
	}
	q.seq++
	h.Item.Seq = q.seq
	q.inflight++
	return true
}

// Deliverable reports whether Pop at time now would hand out an item. A
// non-fair queue only: it is false for a fair one.
func (q *Queue[T]) Deliverable(now time.Time) bool {
	if q.fair {
		return false
	}
	q.advance(now)
	return len(q.ready.s) > 0 || len(q.free.s) > 0
}

// Pop hands out the oldest deliverable item at time now.
func (q *Queue[T]) Pop(now time.Time) (Handle[T], bool) {
	q.advance(now)
	if q.fair {
		return q.popFair()
	}
	var h Handle[T]
	switch {
	case len(q.ready.s) > 0 && (len(q.free.s) == 0 || q.ready.s[0].headSeq < q.free.s[0].Seq):
		ks := q.ready.pop()
		h.Item = ks.popFront()
		h.ks, h.gen = ks, ks.gen
		ks.inflight++
	case len(q.free.s) > 0:
		h.Item = q.free.pop()
	default:
		return h, false
	}
	q.queued--
	q.inflight++
	return h, true
}

// popFair hands out the oldest deliverable item of the fairness key whose
// turn it is, and moves the turn on once the key has had its weight.
func (q *Queue[T]) popFair() (Handle[T], bool) {
	var h Handle[T]
	for q.cur != nil {
		fs := q.cur
		if fs.empty() {
			q.unlinkFair(fs)
			continue
		}
		if len(fs.ready.s) > 0 && (len(fs.free.s) == 0 || fs.ready.s[0].headSeq < fs.free.s[0].Seq) {
			ks := fs.ready.pop()
			h.Item = ks.popFront()
			h.ks, h.gen = ks, ks.gen
			ks.inflight++
		} else {
			h.Item = fs.free.pop()
		}
		fs.served++
		w := 1
		if q.weight != nil {
			w = max(1, q.weight(fs.name))
		}
		if fs.served >= w {
			fs.served = 0
			q.cur = fs.next
		}
		q.queued--
		q.inflight++
		return h, true
	}
	return h, false
}

// PopNext hands out, as part of the same chain, the next item of h's group
// if it is deliverable at now under Ordered (the oldest pending item of the
// group, not delayed). It is how a broker returns several consecutive
// messages of one group in one receive.
func (q *Queue[T]) PopNext(h Handle[T], now time.Time) (Handle[T], bool) {
	var n Handle[T]
	ks := h.ks
	if ks == nil || ks.gen != h.gen || ks.len() == 0 {
		return n, false
	}
	if f := ks.front(); !f.At.IsZero() && f.At.After(now) {
		return n, false
	}
	n.Item = ks.popFront()
	n.ks, n.gen = ks, ks.gen
	ks.inflight++
	q.queued--
	q.inflight++
	return n, true
}

// Done settles a handed-out item as finished; its group moves on.
func (q *Queue[T]) Done(h Handle[T]) { q.Finish(&h) }

// Finish is Done for a handle passed by pointer. The common case (the
// group has nothing else) runs in a small frame, for callers that run on
// a small stack (see Start).
func (q *Queue[T]) Finish(h *Handle[T]) {
	q.inflight--
	ks := h.ks
	if ks == nil {
		return
	}
	ks.inflight--
	if ks.inflight == 0 && ks.len() == 0 && ks.timedAt.IsZero() && ks.readyIdx < 0 {
		q.forget(ks)
		return
	}
	q.settle(ks, time.Time{})
}

// forget removes an idle group (nothing in flight, waiting or timed) and
// keeps its state for reuse.
func (q *Queue[T]) forget(ks *keyState[T]) {
	delete(q.keys, ks.key)
	ks.gen++
	ks.key = ""
	ks.pending = ks.pending[:0]
	ks.head = 0
	q.spare = append(q.spare, ks)
}

// Retry puts a handed-out item back, not deliverable before at. Under Ordered
// it returns to the head of its group and holds the group until at; otherwise
// it waits aside and later items of its group may run first.
func (q *Queue[T]) Retry(h Handle[T], at time.Time) {
	q.inflight--
	q.queued++
	h.Item.At = at
	if h.ks != nil {
		h.ks.inflight--
		if q.ordering == policy.Ordered || h.Item.Hold {
			h.ks.insert(h.Item)
			q.settle(h.ks, time.Time{})
			return
		}
		q.settle(h.ks, time.Time{})
	}
	q.place(h.Item)
}

// Release puts a handed-out item back without delay, in its original place.
func (q *Queue[T]) Release(h Handle[T]) { q.Retry(h, time.Time{}) }

// NextWake returns the earliest time at which a waiting item may become
// deliverable, if any item is waiting on time.
func (q *Queue[T]) NextWake() (time.Time, bool) {
	for len(q.timed.s) > 0 {
		e := q.timed.s[0]
		if e.ks != nil && (e.ks.gen != e.gen || !e.ks.timedAt.Equal(e.at)) {
			q.timed.pop() // stale
			continue
		}
		return e.at, true
	}
	return time.Time{}, false
}

// Drain removes and returns every waiting item (not those in flight), oldest
// first.
func (q *Queue[T]) Drain() []Item[T] {
	var out []Item[T]
	for _, ks := range q.keys {
		out = append(out, ks.pending[ks.head:]...)
		ks.pending, ks.head = ks.pending[:0], 0
		ks.timedAt = time.Time{}
		ks.unready()
	}
	for q.cur != nil {
		fs := q.cur
		out = append(out, fs.free.s...)
		clear(fs.free.s)
		fs.free.s = fs.free.s[:0]
		q.unlinkFair(fs)
	}
	for _, e := range q.timed.s {
		if e.ks == nil {
			out = append(out, e.item)
		}
	}
	out = append(out, q.free.s...)
	clear(q.timed.s)
	clear(q.free.s)
	q.timed.s, q.free.s = q.timed.s[:0], q.free.s[:0]
	for _, ks := range q.keys {
		if ks.inflight == 0 {
			q.settle(ks, time.Time{})
		}
	}
	q.queued = 0
	slices.SortFunc(out, func(a, b Item[T]) int {
		if a.Seq < b.Seq {
			return -1
		}
		return 1
	})
	return out
}
