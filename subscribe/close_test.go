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
