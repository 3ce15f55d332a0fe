package groupq

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/keyorder/keyorder/policy"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

func push(q *Queue[string], name, key string) {
	q.Push(Item[string]{Key: key, Keyed: key != "", Value: name})
}

// TestWorkedExample replays DESIGN.md's worked example at the queue level:
// two workers, Ordered, keyless messages unordered.
func TestWorkedExample(t *testing.T) {
	q := New[string](policy.Ordered)
	for _, m := range [][2]string{{"a1", "A"}, {"a2", "A"}, {"s1", ""}, {"b1", "B"}, {"s2", ""}, {"a3", "A"}, {"b2", "B"}} {
		push(q, m[0], m[1])
	}
	var w [2]*Handle[string]
	take := func(i int, now time.Time) {
		if h, ok := q.Pop(now); ok {
			w[i] = &h
		} else {
			w[i] = nil
		}
	}
	name := func(i int) string {
		if w[i] == nil {
			return "idle"
		}
		return w[i].Item.Value
	}
	check := func(step int, want1, want2 string) {
		t.Helper()
		if name(0) != want1 || name(1) != want2 {
			t.Fatalf("t=%d: W1=%s W2=%s, want %s %s", step, name(0), name(1), want1, want2)
		}
	}
	take(0, at(0))
	take(1, at(0))
	check(0, "a1", "s1")
	q.Done(*w[1])
	take(1, at(1))
	check(1, "a1", "b1")
	q.Done(*w[0])
	take(0, at(2))
	check(2, "a2", "b1")
	q.Done(*w[1])
	take(1, at(3))
	check(3, "a2", "s2")
	q.Retry(*w[0], at(9))
	take(0, at(4))
	check(4, "b2", "s2")
	q.Done(*w[1])
	take(1, at(5))
	check(5, "b2", "idle")
	q.Done(*w[0])
	take(0, at(6))
	check(6, "idle", "idle")
	if wake, ok := q.NextWake(); !ok || !wake.Equal(at(9)) {
		t.Fatalf("NextWake = %v %v, want t=9", wake, ok)
	}
	take(0, at(8))
	check(8, "idle", "idle")
	take(0, at(9))
	check(9, "a2", "idle")
	q.Done(*w[0])
	take(0, at(10))
	check(10, "a3", "idle")
	q.Done(*w[0])
	if q.Len() != 0 || q.InFlight() != 0 || len(q.keys) != 0 {
		t.Fatalf("queue not empty: len=%d inflight=%d keys=%d", q.Len(), q.InFlight(), len(q.keys))
	}
}

func popAll(q *Queue[string], now time.Time) []string {
	var out []string
	for {
		h, ok := q.Pop(now)
		if !ok {
			return out
		}
		out = append(out, h.Item.Value)
	}
}

func TestExclusiveOvertakes(t *testing.T) {
	q := New[string](policy.Exclusive)
	push(q, "101", "acct")
	push(q, "102", "acct")
	h, _ := q.Pop(at(0))
	if got := popAll(q, at(0)); len(got) != 0 {
		t.Fatalf("second of a key delivered while first in flight: %v", got)
	}
	q.Retry(h, at(5))
	h2, ok := q.Pop(at(1))
	if !ok || h2.Item.Value != "102" {
		t.Fatalf("Exclusive: want 102 to overtake the waiting 101, got %v %v", h2.Item.Value, ok)
	}
	q.Done(h2)
	if got := popAll(q, at(4)); len(got) != 0 {
		t.Fatalf("retry delivered before its time: %v", got)
	}
	h3, ok := q.Pop(at(5))
	if !ok || h3.Item.Value != "101" {
		t.Fatalf("want 101 retried at t=5, got %v %v", h3.Item.Value, ok)
	}
}

func TestOrderedNotBeforeHoldsGroup(t *testing.T) {
	q := New[string](policy.Ordered)
	q.Push(Item[string]{Key: "k", Keyed: true, At: at(10), Value: "k1"})
	push(q, "k2", "k")
	push(q, "x1", "x")
	if got := popAll(q, at(0)); !slices.Equal(got, []string{"x1"}) {
		t.Fatalf("got %v, want only x1 while k is held", got)
	}
	if got := popAll(q, at(10)); !slices.Equal(got, []string{"k1"}) {
		t.Fatalf("got %v, want k1 at its not-before time", got)
	}
}

func TestParallelIgnoresKeys(t *testing.T) {
	q := New[string](policy.Parallel)
	push(q, "k1", "k")
	push(q, "k2", "k")
	push(q, "k3", "k")
	if got := popAll(q, at(0)); !slices.Equal(got, []string{"k1", "k2", "k3"}) {
		t.Fatalf("got %v, want all of k at once", got)
	}
}

func TestChainAndRelease(t *testing.T) {
	q := New[string](policy.Ordered)
	for i := 1; i <= 4; i++ {
		push(q, fmt.Sprint("m", i), "k")
	}
	h1, _ := q.Pop(at(0))
	h2, _ := q.PopNext(h1, at(0))
	h3, ok := q.PopNext(h2, at(0))
	if !ok || h2.Item.Value != "m2" || h3.Item.Value != "m3" {
		t.Fatalf("chain = %s %s %s", h1.Item.Value, h2.Item.Value, h3.Item.Value)
	}
	// m1 fails: it holds the group; the rest of its chain is returned.
	q.Retry(h1, at(3))
	q.Release(h3)
	q.Release(h2)
	if got := popAll(q, at(2)); len(got) != 0 {
		t.Fatalf("held group delivered %v", got)
	}
	var order []string
	for now := 3; len(order) < 4; now++ {
		h, ok := q.Pop(at(now))
		if !ok {
			t.Fatalf("nothing deliverable at t=%d after %v", now, order)
		}
		order = append(order, h.Item.Value)
		q.Done(h)
	}
	if !slices.Equal(order, []string{"m1", "m2", "m3", "m4"}) {
		t.Fatalf("order after release = %v", order)
	}
}

func TestDrain(t *testing.T) {
	q := New[string](policy.Ordered)
	push(q, "a1", "a")
	push(q, "a2", "a")
	q.Push(Item[string]{Value: "s1", At: at(100)})
	push(q, "b1", "b")
	h, _ := q.Pop(at(0))
	got := q.Drain()
	var names []string
	for _, it := range got {
		names = append(names, it.Value)
	}
	if !slices.Equal(names, []string{"a2", "s1", "b1"}) {
		t.Fatalf("Drain = %v", names)
	}
	q.Done(h)
	if q.Len() != 0 || q.InFlight() != 0 {
		t.Fatalf("after drain len=%d inflight=%d", q.Len(), q.InFlight())
	}
}

// refQueue is the definition, written naively: scan everything.
type refItem struct {
	name  string
	key   string
	seq   int
	at    time.Time
	state int // 0 waiting, 1 in flight, 2 done
}

type refQueue struct {
	ord   policy.Ordering
	items []*refItem
}

func (r *refQueue) deliverable(it *refItem, now time.Time) bool {
	if it.state != 0 || it.at.After(now) {
		return false
	}
	if it.key == "" || !r.ord.Keyed() {
		return true
	}
	for _, o := range r.items {
		if o.key != it.key || o == it {
			continue
		}
		if o.state == 1 {
			return false
		}
		if r.ord == policy.Ordered && o.state == 0 && o.seq < it.seq {
			return false
		}
	}
	return true
}

func (r *refQueue) pop(now time.Time) *refItem {
	var best *refItem
	for _, it := range r.items {
		if r.deliverable(it, now) && (best == nil || it.seq < best.seq) {
			best = it
		}
	}
	return best
}

// TestAgainstReference drives the queue and the naive definition with the
// same random operations and requires the same choice at every step.
func TestAgainstReference(t *testing.T) {
	for _, ord := range []policy.Ordering{policy.Parallel, policy.Exclusive, policy.Ordered} {
		seed := uint64(time.Now().UnixNano())
		t.Run(ord.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			q := New[*refItem](ord)
			ref := &refQueue{ord: ord}
			handles := map[*refItem]Handle[*refItem]{}
			now := t0
			for step := 0; step < 6000; step++ {
				switch op := rng.IntN(10); {
				case op < 4:
					it := &refItem{name: fmt.Sprint("m", step), seq: step + 1}
					if rng.IntN(5) > 0 {
						it.key = fmt.Sprint("k", rng.IntN(8))
					}
					if rng.IntN(6) == 0 {
						it.at = now.Add(time.Duration(rng.IntN(5)) * time.Second)
					}
					ref.items = append(ref.items, it)
					q.Push(Item[*refItem]{Key: it.key, Keyed: it.key != "", At: it.at, Value: it})
				case op < 7:
					want := ref.pop(now)
					h, ok := q.Pop(now)
					if !ok && want == nil {
						continue
					}
					if !ok || want == nil || h.Item.Value != want {
						t.Fatalf("seed %d step %d: Pop = %v (%v), reference wants %v", seed, step, h.Item.Value, ok, want)
					}
					want.state = 1
					handles[want] = h
				case op == 7 && rng.IntN(2) == 0:
					// Start, as lanes.SubmitOrRun uses it: only when
					// nothing else is deliverable (Deliverable must agree
					// with the reference), and the item is pushed when it
					// cannot start.
					other := ref.pop(now)
					if d := q.Deliverable(now); d != (other != nil) {
						t.Fatalf("seed %d step %d: Deliverable = %v, reference has %v", seed, step, d, other)
					}
					if other != nil {
						continue
					}
					it := &refItem{name: fmt.Sprint("s", step), seq: step + 1}
					if rng.IntN(5) > 0 {
						it.key = fmt.Sprint("k", rng.IntN(8))
					}
					ref.items = append(ref.items, it)
					want := ref.deliverable(it, now)
					qi := Item[*refItem]{Key: it.key, Keyed: it.key != "", Value: it}
					h := Handle[*refItem]{Item: qi}
					ok := q.Start(&h)
					if ok != want {
						t.Fatalf("seed %d step %d: Start(%s, key %q) = %v, reference says %v", seed, step, it.name, it.key, ok, want)
					}
					if !ok {
						q.Push(qi)
						continue
					}
					if h.Item.Value != it {
						t.Fatalf("seed %d step %d: Start handed out %v, want %v", seed, step, h.Item.Value, it)
					}
					it.state = 1
					handles[it] = h
				case op < 9 && len(handles) > 0:
					for it, h := range handles {
						delete(handles, it)
						switch rng.IntN(3) {
						case 0, 1:
							it.state = 2
							q.Done(h)
							ref.items = slices.DeleteFunc(ref.items, func(o *refItem) bool { return o == it })
						case 2:
							it.state = 0
							it.at = now.Add(time.Duration(rng.IntN(4)) * time.Second)
							q.Retry(h, it.at)
						}
						break
					}
				default:
					now = now.Add(time.Second)
				}
			}
		})
	}
}

func BenchmarkPushPopDone(b *testing.B) {
	q := New[int](policy.Ordered)
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprint("key-", i)
	}
	now := t0
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		q.Push(Item[int]{Key: keys[i%len(keys)], Keyed: true, Value: i})
		if i%8 == 7 {
			for {
				h, ok := q.Pop(now)
				if !ok {
					break
				}
				q.Done(h)
			}
		}
	}
}
