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
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// The retry policy is a property of the subscription: a subscription that
// stores MaxAttempts 2 dead-letters after 2 attempts although the consumer
// asks for 5, and the consumer's settings fill only what the subscription
// leaves unsaid.
func TestSubscriptionRetrySettingsRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Retry: &policy.Retry{MaxAttempts: 2}})
		var runs atomic.Int32
		s, stop := w.start(t, nil, &subscribe.Config{Retry: policy.Retry{MaxAttempts: 5, MinBackoff: time.Second, NoJitter: true}},
			func(ctx context.Context, d *keyorder.Delivery) error {
				runs.Add(1)
				return errors.New("always fails")
			})
		stop = stopOnce(stop)
		defer stop()
		w.publish(t, "m1", "k")
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		want := policy.Retry{MaxAttempts: 2, MinBackoff: time.Second, MaxBackoff: policy.MaxBackoffDefault, NoJitter: true}
		if got := s.Retry(); got != want {
			t.Errorf("subscriber runs %+v, want %+v (the subscription's MaxAttempts, the rest from Config)", got, want)
		}
		dl, err := s.DeadLetters(context.Background(), 0)
		if err != nil {
			t.Fatal(err)
		}
		if runs.Load() != 2 || len(dl) != 1 || dl[0].Attempts != 2 {
			t.Fatalf("handler ran %d times, dead letters %+v; want 2 runs and one dead letter after 2 attempts", runs.Load(), dl)
		}
	})
}

// Without stored settings, subscribe.Config.Retry decides, as before.
func TestConfigRetryWithoutStoredSettings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered})
		var runs atomic.Int32
		s, stop := w.start(t, nil, &subscribe.Config{Retry: policy.Retry{MaxAttempts: 3, MinBackoff: time.Second}},
			func(ctx context.Context, d *keyorder.Delivery) error {
				runs.Add(1)
				return errors.New("always fails")
			})
		stop = stopOnce(stop)
		defer stop()
		w.publish(t, "m1", "k")
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		if runs.Load() != 3 || s.Retry().MaxAttempts != 3 {
			t.Fatalf("handler ran %d times under %+v; want 3", runs.Load(), s.Retry())
		}
	})
}
