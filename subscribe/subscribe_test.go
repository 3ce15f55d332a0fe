package subscribe_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/lanes"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type world struct {
	b   *memory.Broker
	pub *publish.Publisher
}

func newWorld(t *testing.T, cfg *memory.SubscriptionOptions) *world {
	t.Helper()
	b := memory.NewBroker()
	if err := b.CreateSubscription("t", "s", cfg); err != nil {
		t.Fatal(err)
	}
	p, err := publish.New(memhook.Of(b).TopicDriver("t"), &publish.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	return &world{b: b, pub: p}
}

func (w *world) publish(t *testing.T, id, key string) {
	t.Helper()
	if _, err := w.pub.Publish(context.Background(), &keyorder.Message{ID: id, Key: key, Payload: []byte(id)}); err != nil {
		t.Fatal(err)
	}
}

func (w *world) start(t *testing.T, drv driver.Subscription, cfg *subscribe.Config, h subscribe.HandlerFunc) (*subscribe.Subscriber, func()) {
	t.Helper()
	if drv == nil {
		var err error
		if drv, err = memhook.Of(w.b).SubscriptionDriver("s"); err != nil {
			t.Fatal(err)
		}
	}
	if cfg == nil {
		cfg = &subscribe.Config{}
	}
	cfg.Logger = quiet
	s, err := subscribe.New(drv, cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background(), h) }()
	return s, func() {
		t.Helper()
		if err := s.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}

func TestRedeliveryOfAckedIDIsSuppressed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered})
		var calls atomic.Int32
		s, stop := w.start(t, nil, nil, func(ctx context.Context, d *keyorder.Delivery) error {
			calls.Add(1)
			return nil
		})
		w.publish(t, "same-id", "k")
		synctest.Wait()
		w.publish(t, "same-id", "k") // the broker delivers it again
		synctest.Wait()
		stop()
		if calls.Load() != 1 || counts(s).Suppressed != 1 {
			t.Fatalf("handler calls = %d, suppressed = %d; want 1 and 1", calls.Load(), counts(s).Suppressed)
		}
	})
}

// stallingLeases withholds lease extensions for a while, as a process
// paused by GC or cut off from its broker would.
type stallingLeases struct {
	driver.Subscription
	mu    sync.Mutex
	until time.Time
}

func (s *stallingLeases) stall(d time.Duration) {
	s.mu.Lock()
	s.until = time.Now().Add(d)
	s.mu.Unlock()
}

func (s *stallingLeases) ExtendLeases(ctx context.Context, ms []*driver.Message) ([]*driver.Message, error) {
	s.mu.Lock()
	stalled := time.Now().Before(s.until)
	s.mu.Unlock()
	if stalled {
		return nil, nil
	}
	return s.Subscription.ExtendLeases(ctx, ms)
}

func TestLostLeaseCancelsHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Lease: 9 * time.Second})
		raw, _ := memhook.Of(w.b).SubscriptionDriver("s")
		drv := &stallingLeases{Subscription: raw}
		var cause atomic.Value
		s, stop := w.start(t, drv, nil, func(ctx context.Context, d *keyorder.Delivery) error {
			if d.Attempt > 1 {
				return nil
			}
			drv.stall(20 * time.Second)
			<-ctx.Done()
			cause.Store(ctx.Err())
			return ctx.Err()
		})
		w.publish(t, "m1", "k")
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		if cause.Load() == nil {
			t.Fatal("the handler's context was not cancelled when its lease was lost")
		}
		if counts(s).LeasesLost < 1 || counts(s).Acked != 1 {
			t.Fatalf("leases lost = %d, acked = %d; want at least 1, and 1 (redelivered and handled)", counts(s).LeasesLost, counts(s).Acked)
		}
	})
}

func TestShutdownDeadlineReleasesWithoutCountingAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered})
		started := make(chan struct{})
		_, stop := w.start(t, nil, &subscribe.Config{ShutdownTimeout: 5 * time.Second}, func(ctx context.Context, d *keyorder.Delivery) error {
			close(started)
			<-ctx.Done()
			return ctx.Err()
		})
		w.publish(t, "m1", "k")
		w.publish(t, "m2", "k")
		<-started
		begin := time.Now()
		stop()
		if took := time.Since(begin); took != 5*time.Second {
			t.Fatalf("shutdown took %v, want the 5s deadline", took)
		}
		var got []string
		var attempts []int
		_, stop2 := w.start(t, nil, nil, func(ctx context.Context, d *keyorder.Delivery) error {
			got = append(got, d.ID)
			attempts = append(attempts, d.Attempt)
			return nil
		})
		synctest.Wait()
		stop2()
		if !slices.Equal(got, []string{"m1", "m2"}) || attempts[0] != 1 {
			t.Fatalf("after shutdown the next subscriber handled %v with attempts %v; want m1 (attempt 1), m2", got, attempts)
		}
	})
}

// TestAttemptsUsedUpByLostLeasesDeadLetter: a message whose lost deliveries
// went past the crash-loop bound (MaxAttempts+1 on a broker that does not
// record starts) is dead-lettered without running. Three consumers crash
// holding it; with two it now gets one run (TestAttemptsUsedUpByLostLeases).
func TestAttemptsUsedUpByLostLeasesDeadLetter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Lease: time.Second})
		w.publish(t, "m1", "k")
		crashing, _ := memhook.Of(w.b).SubscriptionDriver("s")
		for range 3 { // three consumers crash holding m1
			if _, err := crashing.Receive(context.Background(), 1); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Second)
		}
		var calls atomic.Int32
		s, stop := w.start(t, nil, &subscribe.Config{Retry: policy.Retry{MaxAttempts: 2}}, func(ctx context.Context, d *keyorder.Delivery) error {
			calls.Add(1)
			return nil
		})
		synctest.Wait()
		stop()
		dl, _ := s.DeadLetters(context.Background(), 10)
		if calls.Load() != 0 || len(dl) != 1 || dl[0].Attempts != 4 {
			t.Fatalf("calls = %d, dead letters = %+v; want m1 dead-lettered unrun after exhausting attempts", calls.Load(), dl)
		}
	})
}

func TestMiddlewareOrderAndHeaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered})
		var mu sync.Mutex
		var trace []string
		mw := func(name string) subscribe.Middleware {
			return func(next subscribe.HandlerFunc) subscribe.HandlerFunc {
				return func(ctx context.Context, d *keyorder.Delivery) error {
					mu.Lock()
					trace = append(trace, name)
					mu.Unlock()
					return next(ctx, d)
				}
			}
		}
		var key string
		var headers map[string]string
		_, stop := w.start(t, nil, &subscribe.Config{Middleware: []subscribe.Middleware{mw("outer"), mw("inner")}},
			func(ctx context.Context, d *keyorder.Delivery) error {
				mu.Lock()
				trace = append(trace, "handler")
				key, headers = d.Key, d.Headers
				mu.Unlock()
				return nil
			})
		w.publish(t, "m1", "acct-9")
		synctest.Wait()
		stop()
		// The message had no headers: the delivery carries its key as a
		// field and no headers map at all.
		if !slices.Equal(trace, []string{"outer", "inner", "handler"}) || key != "acct-9" || headers != nil {
			t.Fatalf("trace %v, key %q, headers %v (want nil)", trace, key, headers)
		}
	})
}

func TestRunMisuse(t *testing.T) {
	w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered})
	drv, _ := memhook.Of(w.b).SubscriptionDriver("s")
	if _, err := subscribe.New(drv, &subscribe.Config{Workers: -1}); !errors.Is(err, keyorder.ErrInvalidConfig) {
		t.Fatalf("Workers -1 = %v", err)
	}
	for _, a := range []lanes.Assignment{7, -1} {
		_, err := subscribe.New(drv, &subscribe.Config{Assign: a})
		if !errors.Is(err, keyorder.ErrInvalidConfig) || !strings.Contains(err.Error(), "Assign") || !strings.Contains(err.Error(), fmt.Sprint(int(a))) {
			t.Errorf("Assign %d = %v, want ErrInvalidConfig naming the field and value", int(a), err)
		}
	}
	s, err := subscribe.New(drv, &subscribe.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Run(context.Background(), nil); !errors.Is(err, keyorder.ErrInvalidConfig) {
		t.Fatalf("nil handler = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	handled := make(chan struct{}, 1)
	go func() {
		done <- s.Run(ctx, func(context.Context, *keyorder.Delivery) error { handled <- struct{}{}; return nil })
	}()
	w.publish(t, "m1", "k")
	<-handled
	if err := s.Run(ctx, func(context.Context, *keyorder.Delivery) error { return nil }); !errors.Is(err, keyorder.ErrInvalidConfig) {
		t.Fatalf("second Run = %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel = %v", err)
	}
	if _, err := subscribe.Open(context.Background(), "mem://t", nil); !errors.Is(err, keyorder.ErrBadURL) {
		t.Fatalf("subscription URL without a name = %v", err)
	}
}

// greedy returns more messages than asked, breaking the driver contract.
type greedy struct{ driver.Subscription }

func (g greedy) Receive(ctx context.Context, max int) ([]*driver.Message, error) {
	return g.Subscription.Receive(ctx, max+5)
}

// A driver returning more than asked must not leak or double-release
// flow-control tokens (which would stop the pump for good).
func TestDriverReturningTooManyDoesNotStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, MaxBatch: 100})
		raw, _ := memhook.Of(w.b).SubscriptionDriver("s")
		var calls atomic.Int32
		_, stop := w.start(t, greedy{raw}, &subscribe.Config{Workers: 2, MaxOutstanding: 2}, func(ctx context.Context, d *keyorder.Delivery) error {
			calls.Add(1)
			return nil
		})
		for i := range 40 {
			w.publish(t, fmt.Sprint("m", i), fmt.Sprint("k", i%7))
		}
		synctest.Wait()
		stop()
		if calls.Load() != 40 {
			t.Fatalf("handled %d of 40", calls.Load())
		}
	})
}
