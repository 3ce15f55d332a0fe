package subscribe_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// closeCounter counts the driver's Close calls.
type closeCounter struct {
	driver.Subscription
	closes atomic.Int32
}

func (c *closeCounter) Close() error {
	c.closes.Add(1)
	return c.Subscription.Close()
}

func openCounted(t *testing.T, w *world) *closeCounter {
	t.Helper()
	drv, err := memhook.Of(w.b).SubscriptionDriver("s")
	if err != nil {
		t.Fatal(err)
	}
	return &closeCounter{Subscription: drv}
}

func TestCloseBeforeRunReleasesAndRunFails(t *testing.T) {
	w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered})
	drv := openCounted(t, w)
	s, err := subscribe.New(drv, &subscribe.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if n := drv.closes.Load(); n != 1 {
		t.Fatalf("driver closed %d times, want 1", n)
	}
	err = s.Run(context.Background(), func(context.Context, *keyorder.Delivery) error { return nil })
	if !errors.Is(err, keyorder.ErrClosed) {
		t.Fatalf("Run after Close = %v, want ErrClosed", err)
	}
	if err := s.Close(context.Background()); !errors.Is(err, keyorder.ErrClosed) {
		t.Fatalf("second Close = %v, want ErrClosed", err)
	}
	if n := drv.closes.Load(); n != 1 {
		t.Fatalf("driver closed %d times after a second Close, want 1", n)
	}
}

func TestCloseWaitsForGracefulShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered})
		drv := openCounted(t, w)
		s, err := subscribe.New(drv, &subscribe.Config{Logger: quiet, ShutdownTimeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		started := make(chan struct{})
		var finished atomic.Bool
		done := make(chan error, 1)
		go func() {
			done <- s.Run(context.Background(), func(ctx context.Context, d *keyorder.Delivery) error {
				close(started)
				time.Sleep(10 * time.Second) // finishes within the shutdown timeout
				finished.Store(true)
				return nil
			})
		}()
		w.publish(t, "m1", "k")
		<-started
		if err := s.Close(context.Background()); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if !finished.Load() {
			t.Fatal("Close returned before the running handler finished")
		}
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		if n := drv.closes.Load(); n != 1 {
			t.Fatalf("driver closed %d times, want 1", n)
		}
	})
}

func TestCloseDeadlineCutsShutdownShort(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered})
		drv := openCounted(t, w)
		s, err := subscribe.New(drv, &subscribe.Config{Logger: quiet, ShutdownTimeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		started := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- s.Run(context.Background(), func(ctx context.Context, d *keyorder.Delivery) error {
				close(started)
				<-ctx.Done() // runs until cancelled
				return ctx.Err()
			})
		}()
		w.publish(t, "m1", "k")
		<-started
		begin := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Close = %v, want DeadlineExceeded", err)
		}
		if took := time.Since(begin); took != 5*time.Second {
			t.Fatalf("Close took %v, want its 5s deadline (not the hour of ShutdownTimeout)", took)
		}
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		// The handler returns as its context is cancelled; the driver is
		// closed once it has (its lease renewed until then).
		synctest.Wait()
		if n := drv.closes.Load(); n != 1 {
			t.Fatalf("driver closed %d times, want 1", n)
		}
	})
}

// counts returns s's own counts (the memory backend reports no backend
// stats).
func counts(s *subscribe.Subscriber) subscribe.Stats {
	st, err := s.Stats(context.Background())
	if err != nil {
		panic(err)
	}
	return st
}

// TestCloseKeepsRenewingAbandonedHandler: when Close's context ends while
// a handler ignores its own, Close returns then, but the handler's lease
// is renewed until it returns, so no other consumer takes its key while it
// still runs; the driver is closed after it returned. Before the change
// the renewals stopped with Run: a second subscriber on the subscription
// ran m1 about a lease (30 s) after Close, while the first handler ran for
// 5 minutes.
func TestCloseKeepsRenewingAbandonedHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Lease: 30 * time.Second})
		drv := openCounted(t, w)
		s, err := subscribe.New(drv, &subscribe.Config{Logger: quiet, ShutdownTimeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		started := make(chan struct{})
		var firstEnded atomic.Bool
		done := make(chan error, 1)
		go func() {
			done <- s.Run(context.Background(), func(ctx context.Context, d *keyorder.Delivery) error {
				close(started)
				time.Sleep(5 * time.Minute) // ignores its context
				firstEnded.Store(true)
				return nil
			})
		}()
		w.publish(t, "m1", "k")
		<-started
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		begin := time.Now()
		if err := s.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Close = %v, want DeadlineExceeded", err)
		}
		if took := time.Since(begin); took != time.Second {
			t.Fatalf("Close took %v, want its 1s deadline", took)
		}
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		// A second consumer on the subscription.
		var second atomic.Value // time of its first start of m1
		_, stop := w.start(t, nil, nil, func(ctx context.Context, d *keyorder.Delivery) error {
			second.CompareAndSwap(nil, time.Now())
			return nil
		})
		defer stop()
		time.Sleep(4 * time.Minute)
		synctest.Wait()
		if at, ok := second.Load().(time.Time); ok {
			t.Fatalf("a second consumer ran m1 %v after Close returned, while the first handler still ran", at.Sub(begin.Add(time.Second)))
		}
		if n := drv.closes.Load(); n != 0 {
			t.Fatalf("driver closed %d times while an abandoned handler runs; want 0", n)
		}
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if !firstEnded.Load() {
			t.Fatal("the first handler did not end")
		}
		if n := drv.closes.Load(); n != 1 {
			t.Fatalf("driver closed %d times after the abandoned handler returned; want 1", n)
		}
		if _, ok := second.Load().(time.Time); !ok {
			t.Fatal("m1 never ran on the second consumer after the first handler returned (its result is not acted on)")
		}
	})
}
