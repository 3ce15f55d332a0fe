package groupq

import (
	"slices"
	"testing"
	"time"

	"github.com/keyorder/keyorder/policy"
)

func pushFair(q *Queue[string], name, key, fair string) {
	q.Push(Item[string]{Key: key, Keyed: key != "", Value: name, Fair: fair})
}

// popDone pops one item at a time, settling each before the next, and
// returns the order handed out.
func popDone(q *Queue[string]) []string {
	var out []string
	for {
		h, ok := q.Pop(t0)
		if !ok {
			return out
		}
		out = append(out, h.Item.Value)
		q.Done(h)
	}
}

// TestFairRoundRobin: a fairness key with many items does not hold the
// others back: keys are served in turn, each oldest first.
func TestFairRoundRobin(t *testing.T) {
	for _, o := range []policy.Ordering{policy.Parallel, policy.Exclusive, policy.Ordered} {
		t.Run(o.String(), func(t *testing.T) {
			q := NewFair[string](o, nil)
			for i := range 6 {
				pushFair(q, "big"+string(rune('0'+i)), "big-"+string(rune('0'+i%3)), "big")
			}
			pushFair(q, "s1", "s-1", "small")
			pushFair(q, "t1", "", "tiny")
			pushFair(q, "s2", "s-2", "small")
			got := popDone(q)
			want := []string{"big0", "s1", "t1", "big1", "s2", "big2", "big3", "big4", "big5"}
			if !slices.Equal(got, want) {
				t.Fatalf("got %v, want %v", got, want)
			}
		})
	}
}

// TestFairWithoutFairnessIsArrival: the same items in a plain queue come
// out in arrival order (the contrast of TestFairRoundRobin).
func TestFairWithoutFairnessIsArrival(t *testing.T) {
	q := New[string](policy.Ordered)
	for _, n := range []string{"big0", "big1", "s1"} {
		pushFair(q, n, n, "x")
	}
	if got := popDone(q); !slices.Equal(got, []string{"big0", "big1", "s1"}) {
		t.Fatalf("got %v", got)
	}
}

// TestFairWeighted: a weight of 3 serves three items of its key per turn.
func TestFairWeighted(t *testing.T) {
	q := NewFair[string](policy.Parallel, func(k string) int {
		if k == "gold" {
			return 3
		}
		return 0 // below 1 counts as 1
	})
	for i := range 6 {
		pushFair(q, "g"+string(rune('0'+i)), "", "gold")
	}
	for i := range 3 {
		pushFair(q, "b"+string(rune('0'+i)), "", "bronze")
	}
	want := []string{"g0", "g1", "g2", "b0", "g3", "g4", "g5", "b1", "b2"}
	if got := popDone(q); !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// TestFairGroupWithinFairnessKey: the ordering key includes the fairness
// key: fairness has no effect on any group's order (row 1 of the table).
func TestFairGroupWithinFairnessKey(t *testing.T) {
	q := NewFair[string](policy.Ordered, nil)
	for _, m := range [][3]string{
		{"a1", "t1/a", "t1"}, {"a2", "t1/a", "t1"}, {"b1", "t2/b", "t2"}, {"a3", "t1/a", "t1"}, {"b2", "t2/b", "t2"},
	} {
		pushFair(q, m[0], m[1], m[2])
	}
	got := popDone(q)
	if want := []string{"a1", "b1", "a2", "b2", "a3"}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	assertGroupOrder(t, got, map[string][]string{"a": {"a1", "a2", "a3"}, "b": {"b1", "b2"}})
}

// TestFairGroupSpansFairnessKeys: a group spans fairness keys (row 2): the
// scheduler follows the group's order even when another fairness key would
// be next. Group G holds g1 (tenant t1) then g2 (tenant t2); t2 is next in
// turn after t1's g1, but g2 may not run before g1 is done, so t2's other
// item x runs instead and g2 runs after g1.
func TestFairGroupSpansFairnessKeys(t *testing.T) {
	for _, o := range []policy.Ordering{policy.Exclusive, policy.Ordered} {
		t.Run(o.String(), func(t *testing.T) {
			q := NewFair[string](o, nil)
			pushFair(q, "g1", "G", "t1")
			pushFair(q, "g2", "G", "t2")
			pushFair(q, "y", "Y", "t1")
			pushFair(q, "x", "X", "t2")
			h1, _ := q.Pop(t0) // g1 (t1's turn)
			h2, _ := q.Pop(t0) // t2's turn: g2 is behind g1 in flight, so x
			h3, _ := q.Pop(t0) // t1 again: y
			if _, ok := q.Pop(t0); ok {
				t.Fatal("g2 handed out while g1 is in flight")
			}
			got := []string{h1.Item.Value, h2.Item.Value, h3.Item.Value}
			if want := []string{"g1", "x", "y"}; !slices.Equal(got, want) {
				t.Fatalf("got %v, want %v", got, want)
			}
			q.Done(h1)
			h4, ok := q.Pop(t0)
			if !ok || h4.Item.Value != "g2" {
				t.Fatalf("after g1: got %v %v, want g2", h4.Item.Value, ok)
			}
		})
	}
}

// TestFairRetryHoldsGroupAcrossFairnessKeys: under Ordered a retried head
// holds its group (whose next item belongs to another fairness key) until
// its time, while other fairness keys flow.
func TestFairRetryHoldsGroupAcrossFairnessKeys(t *testing.T) {
	q := NewFair[string](policy.Ordered, nil)
	pushFair(q, "g1", "G", "t1")
	pushFair(q, "g2", "G", "t2")
	pushFair(q, "x", "X", "t2")
	h, _ := q.Pop(at(0))
	q.Retry(h, at(5))
	h, ok := q.Pop(at(1))
	if !ok || h.Item.Value != "x" {
		t.Fatalf("got %v %v, want x", h.Item.Value, ok)
	}
	q.Done(h)
	if h, ok := q.Pop(at(2)); ok {
		t.Fatalf("got %v while G's head waits for its retry", h.Item.Value)
	}
	var got []string
	for _, now := range []time.Time{at(5), at(5)} {
		h, ok := q.Pop(now)
		if !ok {
			t.Fatalf("nothing at t=5 after %v", got)
		}
		got = append(got, h.Item.Value)
		q.Done(h)
	}
	if want := []string{"g1", "g2"}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// TestFairWholeQueueOrder: every message in one group (whole-queue order,
// row 3): fairness no longer applies, arrival order decides.
func TestFairWholeQueueOrder(t *testing.T) {
	q := NewFair[string](policy.Ordered, nil)
	names := []string{"a", "b", "c", "d", "e", "f"}
	fairs := []string{"t1", "t1", "t1", "t2", "t3", "t2"}
	for i, n := range names {
		pushFair(q, n, "all", fairs[i])
	}
	if got := popDone(q); !slices.Equal(got, names) {
		t.Fatalf("got %v, want arrival order %v", got, names)
	}
}

// TestFairDrainAndReuse: Drain returns everything waiting, oldest first,
// and the queue serves fairly again afterwards.
func TestFairDrainAndReuse(t *testing.T) {
	q := NewFair[string](policy.Ordered, nil)
	pushFair(q, "a", "A", "t1")
	pushFair(q, "b", "", "t2")
	q.Push(Item[string]{Key: "C", Keyed: true, Value: "c", Fair: "t3", At: at(9)})
	pushFair(q, "a2", "A", "t1")
	h, _ := q.Pop(at(0))
	var got []string
	for _, it := range q.Drain() {
		got = append(got, it.Value)
	}
	if want := []string{"b", "c", "a2"}; !slices.Equal(got, want) {
		t.Fatalf("Drain = %v, want %v", got, want)
	}
	q.Done(h)
	pushFair(q, "x1", "", "t1")
	pushFair(q, "x2", "", "t1")
	pushFair(q, "y1", "", "t2")
	if got, want := popDone(q), []string{"x1", "y1", "x2"}; !slices.Equal(got, want) {
		t.Fatalf("after Drain: %v, want %v", got, want)
	}
	if q.Len() != 0 || q.InFlight() != 0 || len(q.fairs) != 0 {
		t.Fatalf("left: len %d inflight %d fairs %d", q.Len(), q.InFlight(), len(q.fairs))
	}
}

func assertGroupOrder(t *testing.T, got []string, groups map[string][]string) {
	t.Helper()
	for g, want := range groups {
		var seen []string
		for _, n := range got {
			if slices.Contains(want, n) {
				seen = append(seen, n)
			}
		}
		if !slices.Equal(seen, want) {
			t.Fatalf("group %s ran %v, want %v", g, seen, want)
		}
	}
}
