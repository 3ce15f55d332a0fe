package lanes

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/internal/groupq"
	"github.com/keyorder/keyorder/policy"
)

// item is the payload used by most tests.
type item struct {
	name string
	key  string // "" for keyless
}

// event is one handler start, at fake time since the start of the bubble.
type event struct {
	name string
	at   time.Duration
}

type recorder struct {
	mu     sync.Mutex
	start  time.Time
	events []event
}

func newRecorder() *recorder { return &recorder{start: time.Now()} }

func (r *recorder) add(name string) {
	r.mu.Lock()
	r.events = append(r.events, event{name, time.Since(r.start)})
	r.mu.Unlock()
}

func (r *recorder) names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		out = append(out, e.name)
	}
	return out
}

func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	// Starts at the same instant are listed by name: the order in which two
	// workers record them is not defined.
	evs := slices.Clone(r.events)
	slices.SortStableFunc(evs, func(a, b event) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return strings.Compare(a.name, b.name)
	})
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "%s@%v ", e.name, e.at)
	}
	return b.String()
}

func mustNew[T any](t *testing.T, cfg *Config, h Handler[T]) *Pool[T] {
	t.Helper()
	p, err := New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func submit[T any](t *testing.T, p *Pool[T], key string, notBefore time.Time, v T) {
	t.Helper()
	if err := p.Submit(context.Background(), Item{Key: key, Keyed: key != "", NotBefore: notBefore}, v); err != nil {
		t.Fatalf("Submit(%q): %v", key, err)
	}
}

func closePool[T any](t *testing.T, p *Pool[T]) []T {
	t.Helper()
	left, err := p.Close(context.Background())
	if err != nil {
		t.Fatalf("Close: %v", err)
	}
	return left
}

// sameLane returns n distinct keys that p assigns to one lane.
func sameLane[T any](p *Pool[T], n int) []string {
	want := p.laneFor("k0", true)
	out := []string{"k0"}
	for i := 1; len(out) < n; i++ {
		if k := fmt.Sprint("k", i); p.laneFor(k, true) == want {
			out = append(out, k)
		}
	}
	return out
}

// otherLanes returns n keys that p assigns to n different lanes, or just n
// keys if p has a single lane.
func otherLanes[T any](p *Pool[T], n int) []string {
	seen := map[*lane[T]]bool{}
	var out []string
	for i := 0; len(out) < n; i++ {
		k := fmt.Sprint("k", i)
		if l := p.laneFor(k, true); len(p.lanes) == 1 || !seen[l] {
			seen[l] = true
			out = append(out, k)
		}
	}
	return out
}

// TestWorkedExample replays DESIGN.md's worked example with a pool: Ordered,
// Shared, two workers; handler durations reproduce the acknowledgement times.
func TestWorkedExample(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := newRecorder()
		runs := map[string]time.Duration{"a1": 2 * time.Second, "s1": time.Second, "b1": 2 * time.Second,
			"a2": 2 * time.Second, "s2": 2 * time.Second, "b2": 2 * time.Second, "a3": time.Second}
		var mu sync.Mutex
		failed := false
		p := mustNew(t, &Config{Workers: 2, Assign: Shared, Ordering: policy.Ordered},
			func(ctx context.Context, key string, keyed bool, v string) Result {
				rec.add(v)
				mu.Lock()
				retry := v == "a2" && !failed
				if retry {
					failed = true
				}
				mu.Unlock()
				if retry {
					time.Sleep(2 * time.Second)
					return RetryAt(time.Now().Add(5 * time.Second))
				}
				if v == "a2" {
					time.Sleep(time.Second)
				} else {
					time.Sleep(runs[v])
				}
				return Done()
			})
		for _, m := range [][2]string{{"a1", "A"}, {"a2", "A"}, {"s1", ""}, {"b1", "B"}, {"s2", ""}, {"a3", "A"}, {"b2", "B"}} {
			submit(t, p, m[1], time.Time{}, m[0])
		}
		time.Sleep(time.Minute)
		want := "a1@0s s1@0s b1@1s a2@2s s2@3s b2@4s a2@9s a3@10s "
		if got := rec.String(); got != want {
			t.Errorf("starts:\n got %s\nwant %s", got, want)
		}
		closePool(t, p)
	})
}

// TestByKeyOneLaneInOrder: under ByKey each key's items run one at a time in
// submission order, for every ordering.
func TestByKeyOneLaneInOrder(t *testing.T) {
	for _, o := range []policy.Ordering{policy.Parallel, policy.Exclusive, policy.Ordered} {
		t.Run(o.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const keys, per = 40, 25
				var mu sync.Mutex
				running := map[string]int{}
				seen := map[string][]int{}
				p := mustNew(t, &Config{Workers: 4, Assign: ByKey, Ordering: o, Capacity: 16},
					func(ctx context.Context, key string, keyed bool, v int) Result {
						mu.Lock()
						running[key]++
						if running[key] > 1 {
							t.Errorf("key %s: %d in flight", key, running[key])
						}
						seen[key] = append(seen[key], v)
						mu.Unlock()
						time.Sleep(time.Duration(v%3) * time.Millisecond)
						mu.Lock()
						running[key]--
						mu.Unlock()
						return Done()
					})
				for i := range per {
					for k := range keys {
						submit(t, p, fmt.Sprint("key", k), time.Time{}, i)
					}
				}
				synctest.Wait()
				time.Sleep(time.Second)
				mu.Lock()
				defer mu.Unlock()
				for k := range keys {
					key := fmt.Sprint("key", k)
					if got := seen[key]; len(got) != per || !slices.IsSorted(got) {
						t.Errorf("key %s ran %v, want 0..%d in order", key, got, per-1)
					}
				}
				if s := p.Stats(); s != (Stats{}) {
					t.Errorf("Stats = %+v after all done", s)
				}
				closePool(t, p)
			})
		})
	}
}

// TestDifferentKeysConcurrent: different keys run at the same time, under
// ByKey (keys on different lanes) and Shared.
func TestDifferentKeysConcurrent(t *testing.T) {
	for _, a := range []Assignment{ByKey, Shared} {
		for _, o := range []policy.Ordering{policy.Parallel, policy.Ordered} {
			t.Run(a.String()+"/"+o.String(), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					gate := make(chan struct{})
					p := mustNew(t, &Config{Workers: 3, Assign: a, Ordering: o},
						func(ctx context.Context, key string, keyed bool, v int) Result {
							<-gate
							return Done()
						})
					for i, k := range otherLanes(p, 3) {
						submit(t, p, k, time.Time{}, i)
					}
					synctest.Wait()
					if s := p.Stats(); s.InFlight != 3 || s.Queued != 0 {
						t.Errorf("Stats = %+v, want 3 in flight", s)
					}
					close(gate)
					closePool(t, p)
				})
			})
		}
	}
}

// TestParallelSharedRunsKeyConcurrently: Parallel with Shared runs one key's
// items on several workers at once.
func TestParallelSharedRunsKeyConcurrently(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		p := mustNew(t, &Config{Workers: 3, Assign: Shared, Ordering: policy.Parallel},
			func(ctx context.Context, key string, keyed bool, v int) Result {
				<-gate
				return Done()
			})
		for i := range 4 {
			submit(t, p, "hot", time.Time{}, i)
		}
		synctest.Wait()
		if s := p.Stats(); s.InFlight != 3 || s.Queued != 1 {
			t.Errorf("Stats = %+v, want 3 in flight, 1 queued", s)
		}
		close(gate)
		closePool(t, p)
	})
}

// TestAtMostOneInFlightPerKey drives many keys with random durations and
// random RetryAt results, and checks that no key ever has two items in
// flight under Exclusive and Ordered, that nothing is lost, and that under
// Ordered every key completes its items in submission order.
func TestAtMostOneInFlightPerKey(t *testing.T) {
	for _, a := range []Assignment{ByKey, Shared} {
		for _, o := range []policy.Ordering{policy.Exclusive, policy.Ordered} {
			for seed := uint64(1); seed <= 4; seed++ {
				t.Run(fmt.Sprintf("%v/%v/seed=%d", a, o, seed), func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) { stress(t, a, o, seed) })
				})
			}
		}
	}
}

func stress(t *testing.T, a Assignment, o policy.Ordering, seed uint64) {
	const keys, per = 30, 20
	type msg struct {
		key string
		n   int
	}
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, seed))
	running := map[string]int{}
	done := map[string][]int{}
	retries := 0
	p := mustNew(t, &Config{Workers: 4, Assign: a, Ordering: o, Capacity: 8},
		func(ctx context.Context, key string, keyed bool, v msg) Result {
			mu.Lock()
			running[key]++
			if running[key] > 1 {
				t.Errorf("seed %d: key %s has %d in flight", seed, key, running[key])
			}
			d := time.Duration(rng.IntN(5)) * time.Millisecond
			retry := rng.IntN(4) == 0
			var back time.Duration
			if retry {
				retries++
				back = time.Duration(rng.IntN(20)) * time.Millisecond
			}
			mu.Unlock()
			time.Sleep(d)
			mu.Lock()
			running[key]--
			if !retry {
				done[key] = append(done[key], v.n)
			}
			mu.Unlock()
			if retry {
				return RetryAt(time.Now().Add(back))
			}
			return Done()
		})
	for i := range per {
		for k := range keys {
			key := fmt.Sprint("key", k)
			mu.Lock()
			var nb time.Time
			if rng.IntN(10) == 0 {
				nb = time.Now().Add(time.Duration(rng.IntN(10)) * time.Millisecond)
			}
			mu.Unlock()
			submit(t, p, key, nb, msg{key, i})
		}
	}
	time.Sleep(time.Hour)
	mu.Lock()
	for k := range keys {
		key := fmt.Sprint("key", k)
		got := slices.Clone(done[key])
		if o == policy.Ordered && !slices.IsSorted(got) {
			t.Errorf("seed %d: Ordered key %s completed %v, want submission order", seed, key, got)
		}
		slices.Sort(got)
		if !slices.Equal(got, seq(per)) {
			t.Errorf("seed %d: key %s completed %v, want each of 0..%d once", seed, key, got, per-1)
		}
	}
	if retries == 0 {
		t.Errorf("seed %d: no retries exercised", seed)
	}
	mu.Unlock()
	if left := closePool(t, p); len(left) != 0 {
		t.Errorf("seed %d: leftover %v", seed, left)
	}
}

// TestOrderedRetryHoldsOnlyItsKey: under Ordered, RetryAt holds the key
// until the retry time; another key on the same lane keeps running.
func TestOrderedRetryHoldsOnlyItsKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := newRecorder()
		var once sync.Once
		p := mustNew(t, &Config{Workers: 4, Assign: ByKey, Ordering: policy.Ordered},
			func(ctx context.Context, key string, keyed bool, v item) Result {
				rec.add(v.name)
				retry := false
				if v.name == "a1" {
					once.Do(func() { retry = true })
				}
				if retry {
					return RetryAt(time.Now().Add(5 * time.Second))
				}
				time.Sleep(time.Second)
				return Done()
			})
		ks := sameLane(p, 2)
		a, b := ks[0], ks[1]
		for _, it := range []item{{"a1", a}, {"a2", a}, {"b1", b}, {"b2", b}} {
			submit(t, p, it.key, time.Time{}, it)
		}
		time.Sleep(time.Minute)
		want := "a1@0s b1@0s b2@1s a1@5s a2@6s "
		if got := rec.String(); got != want {
			t.Errorf("starts:\n got %s\nwant %s", got, want)
		}
		closePool(t, p)
	})
}

// TestExclusiveRetryLetsLaterOvertake: under Exclusive, a later item of the
// key runs while the retried one waits.
func TestExclusiveRetryLetsLaterOvertake(t *testing.T) {
	for _, a := range []Assignment{ByKey, Shared} {
		t.Run(a.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec := newRecorder()
				var once sync.Once
				p := mustNew(t, &Config{Workers: 2, Assign: a, Ordering: policy.Exclusive},
					func(ctx context.Context, key string, keyed bool, v item) Result {
						rec.add(v.name)
						retry := false
						if v.name == "a1" {
							once.Do(func() { retry = true })
						}
						if retry {
							return RetryAt(time.Now().Add(5 * time.Second))
						}
						time.Sleep(time.Second)
						return Done()
					})
				for _, it := range []item{{"a1", "A"}, {"a2", "A"}, {"a3", "A"}} {
					submit(t, p, it.key, time.Time{}, it)
				}
				time.Sleep(time.Minute)
				want := "a1@0s a2@0s a3@1s a1@5s "
				if got := rec.String(); got != want {
					t.Errorf("starts:\n got %s\nwant %s", got, want)
				}
				closePool(t, p)
			})
		})
	}
}

// TestNotBeforeParksOnlyItsKey: an item submitted with a not-before time
// waits for it; under Ordered it holds its key, under Exclusive later items
// of its key run first; other keys on the same lane are not held.
func TestNotBeforeParksOnlyItsKey(t *testing.T) {
	for _, tc := range []struct {
		o    policy.Ordering
		want string
	}{
		{policy.Ordered, "b1@0s b2@1s a1@3s a2@4s "},
		{policy.Exclusive, "a2@0s b1@1s b2@2s a1@3s "},
		{policy.Parallel, "a2@0s b1@1s b2@2s a1@3s "},
	} {
		t.Run(tc.o.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec := newRecorder()
				p := mustNew(t, &Config{Workers: 4, Assign: ByKey, Ordering: tc.o},
					func(ctx context.Context, key string, keyed bool, v item) Result {
						rec.add(v.name)
						time.Sleep(time.Second)
						return Done()
					})
				ks := sameLane(p, 2)
				a, b := ks[0], ks[1]
				submit(t, p, a, time.Now().Add(3*time.Second), item{"a1", a})
				for _, it := range []item{{"a2", a}, {"b1", b}, {"b2", b}} {
					submit(t, p, it.key, time.Time{}, it)
				}
				time.Sleep(time.Minute)
				if got := rec.String(); got != tc.want {
					t.Errorf("starts:\n got %s\nwant %s", got, tc.want)
				}
				closePool(t, p)
			})
		})
	}
}

// TestKeyless: keyless items reach the handler as "", false, run on every
// lane, and are not grouped.
func TestKeyless(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		var mu sync.Mutex
		var bad []string
		p := mustNew(t, &Config{Workers: 3, Ordering: policy.Ordered},
			func(ctx context.Context, key string, keyed bool, v int) Result {
				if key != "" || keyed {
					mu.Lock()
					bad = append(bad, fmt.Sprintf("%q,%v", key, keyed))
					mu.Unlock()
				}
				<-gate
				return Done()
			})
		for i := range 3 {
			if err := p.Submit(context.Background(), Item{Key: "ignored"}, i); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		if s := p.Stats(); s.InFlight != 3 {
			t.Errorf("Stats = %+v, want 3 keyless items in flight on 3 lanes", s)
		}
		close(gate)
		closePool(t, p)
		if len(bad) > 0 {
			t.Errorf("handler saw key,keyed = %v, want \"\",false", bad)
		}
	})
}

// TestBackpressure: Submit blocks while the lane holds Capacity waiting
// items, resumes when one is taken, and gives up with ctx.Err().
func TestBackpressure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		p := mustNew(t, &Config{Workers: 1, Capacity: 2},
			func(ctx context.Context, key string, keyed bool, v int) Result {
				<-gate
				return Done()
			})
		for i := range 3 { // one in flight, two waiting
			submit(t, p, "k", time.Time{}, i)
		}
		synctest.Wait()
		if s := p.Stats(); s != (Stats{Queued: 2, InFlight: 1}) {
			t.Fatalf("Stats = %+v, want 2 queued, 1 in flight", s)
		}
		errc := make(chan error, 1)
		go func() { errc <- p.Submit(context.Background(), Item{Key: "k", Keyed: true}, 3) }()
		synctest.Wait()
		select {
		case err := <-errc:
			t.Fatalf("Submit on a full lane returned %v, want it blocked", err)
		default:
		}
		gate <- struct{}{} // item 0 done, item 1 taken: one slot frees
		synctest.Wait()
		select {
		case err := <-errc:
			if err != nil {
				t.Fatalf("blocked Submit: %v", err)
			}
		default:
			t.Fatal("Submit still blocked after a slot freed")
		}

		// Full again: a deadline ends the wait.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		start := time.Now()
		err := p.Submit(ctx, Item{Key: "k", Keyed: true}, 4)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != time.Second {
			t.Fatalf("Submit with deadline = %v after %v, want DeadlineExceeded after 1s", err, time.Since(start))
		}
		// And a cancellation.
		ctx, cancel = context.WithCancel(context.Background())
		go func() { errc <- p.Submit(ctx, Item{Key: "k", Keyed: true}, 5) }()
		synctest.Wait()
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Submit = %v, want context.Canceled", err)
		}

		// Several blocked Submits are all admitted as slots free.
		for i := range 3 {
			go func() { errc <- p.Submit(context.Background(), Item{Key: "k", Keyed: true}, 10+i) }()
		}
		synctest.Wait()
		close(gate)
		for range 3 {
			if err := <-errc; err != nil {
				t.Fatalf("blocked Submit: %v", err)
			}
		}
		synctest.Wait()
		if s := p.Stats(); s != (Stats{}) {
			t.Errorf("Stats = %+v, want empty", s)
		}
		closePool(t, p)
	})
}

// TestClose: Close stops admission (also for a blocked Submit), waits for
// the running handler, and returns the waiting, parked and delayed items.
func TestClose(t *testing.T) {
	for _, o := range []policy.Ordering{policy.Parallel, policy.Exclusive, policy.Ordered} {
		t.Run(o.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				gate := make(chan struct{})
				ran := map[string]bool{}
				var mu sync.Mutex
				p := mustNew(t, &Config{Workers: 1, Ordering: o, Capacity: 5},
					func(ctx context.Context, key string, keyed bool, v string) Result {
						mu.Lock()
						ran[v] = true
						mu.Unlock()
						switch v {
						case "r1":
							return RetryAt(time.Now().Add(time.Hour)) // parked (Ordered) or delayed
						case "x1":
							<-gate
						}
						return Done()
					})
				submit(t, p, "r", time.Time{}, "r1")
				synctest.Wait()
				submit(t, p, "x", time.Time{}, "x1")
				synctest.Wait() // x1 running, r1 waiting for its retry
				submit(t, p, "x", time.Time{}, "x2")
				submit(t, p, "d", time.Now().Add(time.Hour), "d1")
				submit(t, p, "", time.Time{}, "s1")
				submit(t, p, "r", time.Time{}, "r2")
				// The lane is full (r1, x2, d1, s1, r2): one more blocks.
				errc := make(chan error, 1)
				go func() { errc <- p.Submit(context.Background(), Item{Key: "y", Keyed: true}, "y1") }()

				type res struct {
					left []string
					err  error
				}
				closed := make(chan res, 1)
				go func() {
					l, err := p.Close(context.Background())
					closed <- res{l, err}
				}()
				synctest.Wait()
				select {
				case r := <-closed:
					t.Fatalf("Close returned %v while a handler runs", r)
				default:
				}
				if err := <-errc; !errors.Is(err, keyorder.ErrClosed) {
					t.Errorf("Submit blocked when Close started = %v, want ErrClosed", err)
				}
				if err := p.Submit(context.Background(), Item{Key: "z", Keyed: true}, "z1"); !errors.Is(err, keyorder.ErrClosed) {
					t.Errorf("Submit after Close = %v, want ErrClosed", err)
				}
				close(gate)
				r := <-closed
				if r.err != nil {
					t.Errorf("Close: %v", r.err)
				}
				// Ordered keeps r1 at the head of its key; otherwise it
				// waits aside with its original arrival order too.
				if want := []string{"r1", "x2", "d1", "s1", "r2"}; !slices.Equal(r.left, want) {
					t.Errorf("leftover = %v, want %v", r.left, want)
				}
				for _, v := range []string{"x2", "d1", "s1", "r2", "y1"} {
					if ran[v] {
						t.Errorf("%s ran after Close started", v)
					}
				}
				if left, err := p.Close(context.Background()); left != nil || !errors.Is(err, keyorder.ErrClosed) {
					t.Errorf("second Close = %v, %v; want nil, ErrClosed", left, err)
				}
				if s := p.Stats(); s != (Stats{}) {
					t.Errorf("Stats after Close = %+v", s)
				}
			})
		})
	}
}

// TestCloseDeadline: when Close's context ends, the handlers' context is
// cancelled, Close still waits for them, and reports the context's error.
func TestCloseDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var cancelledAt []time.Duration
		start := time.Now()
		p := mustNew(t, &Config{Workers: 2, Assign: Shared},
			func(ctx context.Context, key string, keyed bool, v int) Result {
				<-ctx.Done()
				time.Sleep(time.Second) // cleanup after cancellation
				mu.Lock()
				cancelledAt = append(cancelledAt, time.Since(start))
				mu.Unlock()
				return Done()
			})
		for i := range 3 {
			submit(t, p, "", time.Time{}, i)
		}
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		left, err := p.Close(ctx)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Close err = %v, want DeadlineExceeded", err)
		}
		if d := time.Since(start); d != 11*time.Second {
			t.Errorf("Close returned after %v, want 11s (deadline + handler cleanup)", d)
		}
		if !slices.Equal(cancelledAt, []time.Duration{11 * time.Second, 11 * time.Second}) {
			t.Errorf("handlers returned at %v, want both at 11s", cancelledAt)
		}
		if !slices.Equal(left, []int{2}) {
			t.Errorf("leftover = %v, want [2]", left)
		}
	})
}

// TestInvalidConfig: out-of-range fields are rejected, naming the field.
func TestInvalidConfig(t *testing.T) {
	noop := func(context.Context, string, bool, int) Result { return Done() }
	for _, tc := range []struct {
		cfg   *Config
		h     Handler[int]
		field string
	}{
		{&Config{Workers: -1}, noop, "Workers"},
		{&Config{Capacity: -1}, noop, "Capacity"},
		{&Config{Assign: 7}, noop, "Assign"},
		{&Config{Ordering: 9}, noop, "Ordering"},
		{&Config{Ordering: -1}, noop, "Ordering"},
		{nil, nil, "Handler"},
	} {
		p, err := New(tc.cfg, tc.h)
		if p != nil || !errors.Is(err, keyorder.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("New(%+v) = %v, %v; want ErrInvalidConfig naming %s", tc.cfg, p, err, tc.field)
		}
	}
}

// TestDefaults: nil and zero configs get the documented defaults.
func TestDefaults(t *testing.T) {
	for _, cfg := range []*Config{nil, {}} {
		c := cfg.WithDefaults()
		if c.Workers < 1 || c.Capacity != CapacityDefault || c.Assign != Shared || c.Ordering != policy.Ordered {
			t.Errorf("%+v.WithDefaults() = %+v", cfg, c)
		}
	}
	synctest.Test(t, func(t *testing.T) {
		p := mustNew(t, nil, func(context.Context, string, bool, int) Result { return Done() })
		if len(p.lanes) != 1 {
			t.Errorf("%d lanes, want 1 (Shared)", len(p.lanes))
		}
		closePool(t, p)
		p = mustNew(t, &Config{Assign: ByKey}, func(context.Context, string, bool, int) Result { return Done() })
		if len(p.lanes) != (&Config{}).WithDefaults().Workers {
			t.Errorf("ByKey: %d lanes, want GOMAXPROCS", len(p.lanes))
		}
		closePool(t, p)
	})
}

// TestSteadyStateAllocs: submitting and running items does not allocate
// once the pool is warm.
func TestSteadyStateAllocs(t *testing.T) {
	for _, c := range []struct {
		a Assignment
		o policy.Ordering
	}{{ByKey, policy.Parallel}, {ByKey, policy.Ordered}, {Shared, policy.Parallel}, {Shared, policy.Ordered}} {
		t.Run(c.a.String()+"/"+c.o.String(), func(t *testing.T) {
			done := make(chan struct{}, 1)
			p := mustNew(t, &Config{Workers: 2, Assign: c.a, Ordering: c.o},
				func(ctx context.Context, key string, keyed bool, v int) Result {
					if v < 0 {
						done <- struct{}{}
					}
					return Done()
				})
			defer closePool(t, p)
			markers := otherLanes(p, 2)
			keys := make([]string, 100)
			for i := range keys {
				keys[i] = fmt.Sprint("key", i)
			}
			ctx := context.Background()
			round := func() {
				for i := range 1000 {
					if err := p.Submit(ctx, Item{Key: keys[i%len(keys)], Keyed: true}, i); err != nil {
						t.Fatal(err)
					}
				}
				// One marker per lane, then wait for both.
				for _, k := range markers {
					p.Submit(ctx, Item{Key: k, Keyed: true}, -1)
				}
				<-done
				<-done
			}
			round()
			if a := testing.AllocsPerRun(20, round); a > 5 {
				t.Errorf("%.0f allocations per 1000 items", a)
			}
		})
	}
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// TestSingleWorkerRuns: a single-worker lane takes runs of items at once;
// a retry in the middle of a run, and Close, must leave the same result as
// taking items one by one.
func TestSingleWorkerRuns(t *testing.T) {
	for _, tc := range []struct {
		o    policy.Ordering
		want string
	}{
		{policy.Ordered, "x0@0s a1@1s b1@1s b2@1s a1@6s a2@6s "},
		{policy.Exclusive, "x0@0s a1@1s a2@1s b1@1s b2@1s a1@6s "},
	} {
		t.Run("retry/"+tc.o.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec := newRecorder()
				var once sync.Once
				p := mustNew(t, &Config{Workers: 1, Ordering: tc.o},
					func(ctx context.Context, key string, keyed bool, v string) Result {
						rec.add(v)
						retry := false
						switch v {
						case "x0":
							time.Sleep(time.Second) // the rest queue up behind it
						case "a1":
							once.Do(func() { retry = true })
						}
						if retry {
							return RetryAt(time.Now().Add(5 * time.Second))
						}
						return Done()
					})
				submit(t, p, "x", time.Time{}, "x0")
				synctest.Wait()
				for _, it := range []item{{"a1", "A"}, {"a2", "A"}, {"b1", "B"}, {"b2", "B"}} {
					submit(t, p, it.key, time.Time{}, it.name)
				}
				time.Sleep(time.Minute)
				if got := rec.String(); got != tc.want {
					t.Errorf("starts:\n got %s\nwant %s", got, tc.want)
				}
				closePool(t, p)
			})
		})
	}
	t.Run("close", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			gate := make(chan struct{})
			rec := newRecorder()
			p := mustNew(t, &Config{Workers: 1},
				func(ctx context.Context, key string, keyed bool, v int) Result {
					rec.add(fmt.Sprint(v))
					switch v {
					case 0:
						time.Sleep(time.Second)
					case 1:
						<-gate
					}
					return Done()
				})
			for i := range 10 {
				submit(t, p, "k", time.Time{}, i)
			}
			time.Sleep(2 * time.Second) // 1 is running, 2..9 were taken with it
			if s := p.Stats(); s != (Stats{Queued: 8, InFlight: 1}) {
				t.Errorf("Stats = %+v, want 8 queued, 1 in flight", s)
			}
			type res struct {
				left []int
				err  error
			}
			closed := make(chan res, 1)
			go func() {
				l, err := p.Close(context.Background())
				closed <- res{l, err}
			}()
			synctest.Wait()
			close(gate)
			r := <-closed
			if r.err != nil || !slices.Equal(r.left, []int{2, 3, 4, 5, 6, 7, 8, 9}) {
				t.Errorf("Close = %v, %v; want [2..9], nil", r.left, r.err)
			}
			if got := rec.names(); !slices.Equal(got, []string{"0", "1"}) {
				t.Errorf("ran %v, want [0 1]", got)
			}
		})
	})
}

// TestSingleLaneMatchesGroupq checks a single-worker lane, with its staging
// FIFO and runs of items taken at once, against the plain model it
// optimises: one groupq.Queue holding everything, one worker popping the
// oldest deliverable item. Handler durations, retries and not-before times
// are random (seeded) but fixed per item and attempt, so under synctest the
// pool must start exactly the same items at exactly the same times.
func TestSingleLaneMatchesGroupq(t *testing.T) {
	for _, o := range []policy.Ordering{policy.Parallel, policy.Exclusive, policy.Ordered} {
		for seed := uint64(1); seed <= 6; seed++ {
			t.Run(fmt.Sprintf("%v/seed=%d", o, seed), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) { matchModel(t, o, seed) })
			})
		}
	}
}

type modelItem struct {
	key  string // "" for keyless
	nb   time.Duration
	dur  [4]time.Duration // per attempt
	back [4]time.Duration // retry delay per attempt, -1 for Done
}

func modelItems(seed uint64, n int) []modelItem {
	rng := rand.New(rand.NewPCG(seed, 99))
	items := make([]modelItem, n)
	for i := range items {
		it := &items[i]
		if k := rng.IntN(9); k < 8 {
			it.key = fmt.Sprint("k", k)
		}
		if rng.IntN(10) == 0 {
			it.nb = time.Duration(1+rng.IntN(8)) * time.Millisecond
		}
		for a := range it.dur {
			it.dur[a] = time.Duration(rng.IntN(3)) * time.Millisecond
			it.back[a] = -1
			if a < 3 && rng.IntN(4) == 0 {
				it.back[a] = time.Duration(rng.IntN(6)) * time.Millisecond
			}
		}
	}
	return items
}

func matchModel(t *testing.T, o policy.Ordering, seed uint64) {
	const n = 300
	items := modelItems(seed, n)
	start := time.Now()

	// The model.
	var want []string
	q := groupq.New[int](o)
	for i, it := range items {
		var at time.Time
		if it.nb > 0 {
			at = start.Add(it.nb)
		}
		q.Push(groupq.Item[int]{Key: it.key, Keyed: it.key != "", At: at, Value: i})
	}
	now := start
	attempts := make([]int, n)
	for q.Len() > 0 {
		h, ok := q.Pop(now)
		if !ok {
			now, _ = q.NextWake()
			continue
		}
		i := h.Item.Value
		a := attempts[i]
		attempts[i]++
		want = append(want, fmt.Sprintf("%d@%v", i, now.Sub(start)))
		now = now.Add(items[i].dur[a])
		if b := items[i].back[a]; b >= 0 {
			q.Retry(h, now.Add(b))
		} else {
			q.Done(h)
		}
	}

	// The pool.
	var mu sync.Mutex
	var got []string
	clear(attempts)
	p := mustNew(t, &Config{Workers: 1, Ordering: o, Capacity: n}, // every item is there at t=0, as in the model
		func(ctx context.Context, key string, keyed bool, i int) Result {
			mu.Lock()
			a := attempts[i]
			attempts[i]++
			got = append(got, fmt.Sprintf("%d@%v", i, time.Since(start)))
			mu.Unlock()
			time.Sleep(items[i].dur[a])
			if b := items[i].back[a]; b >= 0 {
				return RetryAt(time.Now().Add(b))
			}
			return Done()
		})
	for i, it := range items {
		var nb time.Time
		if it.nb > 0 {
			nb = start.Add(it.nb)
		}
		if err := p.Submit(context.Background(), Item{Key: it.key, Keyed: it.key != "", NotBefore: nb}, i); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Hour)
	closePool(t, p)
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got, want) {
		for i := range min(len(got), len(want)) {
			if got[i] != want[i] {
				t.Fatalf("seed %d: start %d differs: pool %s, model %s\npool  %v\nmodel %v", seed, i, got[i], want[i], got[max(0, i-5):min(len(got), i+5)], want[max(0, i-5):min(len(want), i+5)])
			}
		}
		t.Fatalf("seed %d: pool made %d starts, model %d", seed, len(got), len(want))
	}
}

// WaitAt keeps a key's order under Exclusive, where RetryAt lets later items
// of the key run first; under both, other keys run meanwhile.
func TestWaitAtHoldsKeyUnderExclusive(t *testing.T) {
	for _, tc := range []struct {
		name   string
		result func(time.Time) Result
		want   []string
	}{
		{"RetryAt", RetryAt, []string{"a1", "b1", "a2", "a1"}},
		{"WaitAt", WaitAt, []string{"a1", "b1", "a1", "a2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var mu sync.Mutex
				var got []string
				first := true
				p, err := New(&Config{Workers: 1, Ordering: policy.Exclusive}, func(ctx context.Context, key string, keyed bool, v string) Result {
					mu.Lock()
					defer mu.Unlock()
					got = append(got, v)
					if v == "a1" && first {
						first = false
						return tc.result(time.Now().Add(time.Second))
					}
					return Done()
				})
				if err != nil {
					t.Fatal(err)
				}
				for _, it := range [][2]string{{"a", "a1"}, {"b", "b1"}, {"a", "a2"}} {
					if err := p.Submit(context.Background(), Item{Key: it[0], Keyed: true}, it[1]); err != nil {
						t.Fatal(err)
					}
				}
				time.Sleep(2 * time.Second)
				synctest.Wait()
				if _, err := p.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, tc.want) {
					t.Fatalf("ran %v, want %v", got, tc.want)
				}
			})
		})
	}
}
