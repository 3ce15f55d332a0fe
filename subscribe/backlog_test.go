package subscribe_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/lanes"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// keyTrail records, per key, the messages handled as "id@attempt", in the
// order their handler runs started.
type keyTrail struct {
	mu sync.Mutex
	m  map[string][]string
}

func (r *keyTrail) add(d *keyorder.Delivery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string][]string{}
	}
	r.m[d.Key] = append(r.m[d.Key], fmt.Sprintf("%s@%d", d.ID, d.Attempt))
}

func (r *keyTrail) get(key string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.m[key])
}

// backlogWant is key A's trail when a1's first attempt fails and a2..an
// follow: a1 twice, then each of the others once, in order, none of them
// with an attempt counted before it ran.
func backlogWant(n int) []string {
	want := []string{"a1@1", "a1@2"}
	for i := 2; i <= n; i++ {
		want = append(want, fmt.Sprintf("a%d@1", i))
	}
	return want
}

// backlogHandlers returns a handler and a batch handler that record into
// trail and fail a1's first attempt with RetryAfter(hold).
func backlogHandlers(trail *keyTrail, hold time.Duration) (subscribe.HandlerFunc, subscribe.BatchHandlerFunc) {
	h := func(ctx context.Context, d *keyorder.Delivery) error {
		trail.add(d)
		if d.ID == "a1" && d.Attempt == 1 {
			return keyorder.RetryAfter(errors.New("not yet"), hold)
		}
		return nil
	}
	bh := func(ctx context.Context, ds []*keyorder.Delivery) error {
		for i, d := range ds {
			if err := h(ctx, d); err != nil {
				return keyorder.FailedAt(i, err)
			}
		}
		return nil
	}
	return h, bh
}

// TestHeldKeyBacklogDoesNotStopOtherKeys: a key held in process (its head
// waiting an hour for its retry) with a backlog larger than a lane holds
// (lanes.CapacityDefault) must not stop the other keys: b1, published
// after a's backlog, runs long before a's hour is up. Then a's messages
// all run, in order, each counted once. Where the broker holds the key
// (Native) the backlog stays on the broker; the subtests check that shape
// too.
func TestHeldKeyBacklogDoesNotStopOtherKeys(t *testing.T) {
	for _, tc := range []struct {
		name string
		hold memory.Hold
		// batch: 0 runs Run; otherwise RunBatch with this Batch.MaxSize,
		// and a backlog of batch times as many messages, so that the
		// lanes would carry more than their capacity of batches.
		batch int
	}{
		{"inprocess/Run", memory.InProcess, 0},
		{"inprocess/RunBatch", memory.InProcess, 2},
		{"native/Run", memory.Native, 0},
		{"native/RunBatch", memory.Native, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const hold = time.Hour
				n := lanes.CapacityDefault + 76 // 1,100 messages behind a1
				if tc.batch > 0 {
					n *= tc.batch
				}
				w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: tc.hold})
				var trail keyTrail
				h, bh := backlogHandlers(&trail, hold)
				cfg := &subscribe.Config{Workers: 2}
				var s *subscribe.Subscriber
				var stop func()
				if tc.batch > 0 {
					cfg.Batch = &subscribe.BatchConfig{MaxSize: tc.batch}
					s, stop = w.startBatch(t, cfg, bh)
				} else {
					s, stop = w.start(t, nil, cfg, h)
				}
				stop = stopOnce(stop)
				defer stop()
				start := time.Now()

				w.publish(t, "a1", "A")
				time.Sleep(time.Second)
				synctest.Wait()
				if got := trail.get("A"); !slices.Equal(got, []string{"a1@1"}) {
					t.Fatalf("key A handled %v, want a1's first attempt", got)
				}
				for i := 2; i <= n+1; i++ {
					w.publish(t, fmt.Sprintf("a%d", i), "A")
				}
				w.publish(t, "b1", "B")
				time.Sleep(time.Minute)
				synctest.Wait()
				if got := trail.get("B"); !slices.Equal(got, []string{"b1@1"}) {
					t.Fatalf("after %v key B handled %v, want b1: key A's backlog of %d behind its held head stopped key B",
						time.Since(start), got, n)
				}
				if got := trail.get("A"); !slices.Equal(got, []string{"a1@1"}) {
					t.Fatalf("key A handled %v before a1's retry time", got)
				}
				checkHeldBound(t, s, cfg)

				time.Sleep(hold)
				synctest.Wait()
				stop()
				if got, want := trail.get("A"), backlogWant(n+1); !slices.Equal(got, want) {
					t.Fatalf("key A handled %d messages %v..., want %d in order %v...",
						len(got), got[:min(len(got), 5)], len(want), want[:5])
				}
			})
		})
	}
}

// checkHeldBound checks that s never had more messages outstanding than
// its configuration allows (Config.MaxOutstanding+Config.MaxHeld, after
// defaults; RunBatch's default MaxOutstanding where cfg leaves it zero).
func checkHeldBound(t *testing.T, s *subscribe.Subscriber, cfg *subscribe.Config) {
	t.Helper()
	c := cfg.WithDefaults()
	if cfg.MaxOutstanding == 0 && cfg.Batch != nil {
		c.MaxOutstanding = 2 * c.Workers * c.Batch.MaxSize
	}
	bound := c.MaxOutstanding + c.MaxHeld
	if peak := subscribe.PeakOutstanding(s); peak > bound {
		t.Errorf("%d messages outstanding at once, more than MaxOutstanding+MaxHeld = %d+%d", peak, c.MaxOutstanding, c.MaxHeld)
	}
	st, err := s.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Outstanding > bound {
		t.Errorf("Stats: %d outstanding (%d held), want at most %d", st.Outstanding, st.Held, bound)
	}
}

// TestHeldBacklogBeyondMaxHeldPausesReceiving: a held key's backlog larger
// than Config.MaxHeld is not all taken into memory: the subscriber stops
// receiving at MaxOutstanding+MaxHeld messages (holding every key, the
// price of a bound on a broker that streams a key regardless of what is
// unsettled) and receives again once the key's head has run and its
// backlog with it. Nothing is lost, reordered or counted twice, and b1,
// published behind the backlog, runs once the pause ends.
func TestHeldBacklogBeyondMaxHeldPausesReceiving(t *testing.T) {
	for _, batch := range []int{0, 3} {
		name := "Run"
		if batch > 0 {
			name = "RunBatch"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const hold, n = time.Hour, 200
				w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: memory.InProcess})
				var trail keyTrail
				h, bh := backlogHandlers(&trail, hold)
				cfg := &subscribe.Config{Workers: 2, MaxOutstanding: 6, MaxHeld: 50}
				var s *subscribe.Subscriber
				var stop func()
				if batch > 0 {
					cfg.Batch = &subscribe.BatchConfig{MaxSize: batch}
					s, stop = w.startBatch(t, cfg, bh)
				} else {
					s, stop = w.start(t, nil, cfg, h)
				}
				stop = stopOnce(stop)
				defer stop()

				w.publish(t, "a1", "A")
				time.Sleep(time.Second)
				synctest.Wait()
				for i := 2; i <= n+1; i++ {
					w.publish(t, fmt.Sprintf("a%d", i), "A")
				}
				w.publish(t, "b1", "B")
				time.Sleep(time.Minute)
				synctest.Wait()
				checkHeldBound(t, s, cfg)
				st, err := s.Stats(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if st.Held < cfg.MaxHeld {
					t.Errorf("%d messages held while receiving is paused, want MaxHeld (%d)", st.Held, cfg.MaxHeld)
				}

				time.Sleep(hold)
				synctest.Wait()
				checkHeldBound(t, s, cfg)
				stop()
				if got, want := trail.get("A"), backlogWant(n+1); !slices.Equal(got, want) {
					t.Fatalf("key A handled %d messages %v..., want %d in order %v...",
						len(got), got[:min(len(got), 5)], len(want), want[:5])
				}
				if got := trail.get("B"); !slices.Equal(got, []string{"b1@1"}) {
					t.Fatalf("key B handled %v, want b1 once", got)
				}
			})
		})
	}
}
