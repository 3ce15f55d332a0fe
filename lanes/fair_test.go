package lanes

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/keyorder/keyorder/policy"
)

// fairRun submits, behind a gate item that blocks the workers, the items
// [name, key, fairKey] and returns the order in which they start.
func fairRun(t *testing.T, cfg *Config, items [][3]string) []string {
	t.Helper()
	var got []string
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		gate := make(chan struct{})
		p := mustNew(t, cfg, func(ctx context.Context, key string, keyed bool, v string) Result {
			if v == "gate" {
				<-gate
				return Done()
			}
			mu.Lock()
			got = append(got, v)
			mu.Unlock()
			time.Sleep(time.Millisecond)
			return Done()
		})
		workers := max(cfg.Workers, 1)
		for i := range workers {
			if err := p.Submit(context.Background(), Item{Key: fmt.Sprint("gate", i), Keyed: true, Fairness: "gate"}, "gate"); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		for _, it := range items {
			if err := p.Submit(context.Background(), Item{Key: it[1], Keyed: it[1] != "", Fairness: it[2]}, it[0]); err != nil {
				t.Fatal(err)
			}
		}
		close(gate)
		synctest.Wait()
		time.Sleep(time.Second)
		closePool(t, p)
	})
	return got
}

// bigAndSmall: tenant big has six items (over three keys) queued before
// two tenants' one each.
var bigAndSmall = [][3]string{
	{"big0", "b0", "big"}, {"big1", "b1", "big"}, {"big2", "b2", "big"},
	{"big3", "b0", "big"}, {"big4", "b1", "big"}, {"big5", "b2", "big"},
	{"s1", "s1", "small"}, {"t1", "", "tiny"},
}

// TestFairSingleWorker: a single-worker lane (ByKey, one lane) serves
// tenants in turn; the fast path that runs staged items by arrival must not
// bypass fairness.
func TestFairSingleWorker(t *testing.T) {
	for _, o := range []policy.Ordering{policy.Parallel, policy.Exclusive, policy.Ordered} {
		t.Run(o.String(), func(t *testing.T) {
			got := fairRun(t, &Config{Workers: 1, Ordering: o, Fair: true}, bigAndSmall)
			want := []string{"big0", "s1", "t1", "big1", "big2", "big3", "big4", "big5"}
			if !slices.Equal(got, want) {
				t.Fatalf("got %v, want %v", got, want)
			}
		})
	}
}

// TestNotFairIsArrival: without Fair the same lane runs by arrival.
func TestNotFairIsArrival(t *testing.T) {
	got := fairRun(t, &Config{Workers: 1, Ordering: policy.Ordered}, bigAndSmall)
	want := []string{"big0", "big1", "big2", "big3", "big4", "big5", "s1", "t1"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// TestFairShared: a shared lane with two workers serves tenants in turn,
// and the small tenants start among the first items.
func TestFairShared(t *testing.T) {
	got := fairRun(t, &Config{Workers: 2, Assign: Shared, Ordering: policy.Ordered, Fair: true}, bigAndSmall)
	if i, j := slices.Index(got, "s1"), slices.Index(got, "t1"); i > 3 || j > 3 {
		t.Fatalf("small tenants started late: %v", got)
	}
}

// TestFairKeySpanningTenants: a key whose items belong to different
// fairness keys runs in its own order (the group wins over the turn), and
// a pool whose items share one key runs in arrival order.
func TestFairKeySpanningTenants(t *testing.T) {
	items := [][3]string{
		{"g1", "G", "t1"}, {"g2", "G", "t2"}, {"g3", "G", "t1"}, {"g4", "G", "t3"},
		{"x1", "X", "t2"}, {"y1", "Y", "t3"},
	}
	got := fairRun(t, &Config{Workers: 1, Ordering: policy.Ordered, Fair: true}, items)
	var g []string
	for _, n := range got {
		if n[0] == 'g' {
			g = append(g, n)
		}
	}
	if want := []string{"g1", "g2", "g3", "g4"}; !slices.Equal(g, want) {
		t.Fatalf("group G ran %v (all: %v), want %v", g, got, want)
	}
	if len(got) != len(items) {
		t.Fatalf("ran %v", got)
	}
	// Whole-queue order: one key for everything.
	var one [][3]string
	var want []string
	for i := range 8 {
		one = append(one, [3]string{fmt.Sprint("m", i), "all", fmt.Sprint("t", i%3)})
		want = append(want, fmt.Sprint("m", i))
	}
	if got := fairRun(t, &Config{Workers: 1, Ordering: policy.Ordered, Fair: true}, one); !slices.Equal(got, want) {
		t.Fatalf("one key: got %v, want arrival order %v", got, want)
	}
}

// TestFairRetryHoldsOnlyItsKey: under Ordered in a fair lane, a retried item
// holds its key only; other tenants and keys keep running meanwhile.
func TestFairRetryHoldsOnlyItsKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var got []string
		retried := false
		start := time.Now()
		p := mustNew(t, &Config{Workers: 1, Ordering: policy.Ordered, Fair: true},
			func(ctx context.Context, key string, keyed bool, v string) Result {
				mu.Lock()
				defer mu.Unlock()
				got = append(got, fmt.Sprintf("%s@%v", v, time.Since(start)))
				if v == "a1" && !retried {
					retried = true
					return RetryAt(time.Now().Add(10 * time.Second))
				}
				return Done()
			})
		for _, it := range [][3]string{{"a1", "A", "t1"}, {"a2", "A", "t1"}, {"b1", "B", "t2"}, {"c1", "C", "t1"}} {
			if err := p.Submit(context.Background(), Item{Key: it[1], Keyed: true, Fairness: it[2]}, it[0]); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Minute)
		closePool(t, p)
		want := []string{"a1@0s", "b1@0s", "c1@0s", "a1@10s", "a2@10s"}
		if !slices.Equal(got, want) {
			t.Fatalf("got %v, want %v", got, want)
		}
	})
}
