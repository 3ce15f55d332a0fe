package postgres_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// The retry settings stored with a subscription are the ones that run: a
// subscription created with max_attempts 2 dead-letters a failing message
// after 2 attempts although the consumer's Config asks for 5.
func TestStoredRetrySettingsRun(t *testing.T) {
	e := newEnv(t)
	tp := e.topic("t", nil)
	o := e.opts(nil)
	o.Create = true
	o.Subscription = &postgres.SubscriptionOptions{Ordering: policy.Ordered, MaxAttempts: 2, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
	drv, err := postgres.OpenSubscription(context.Background(), e.pool, "t", "s", o)
	if err != nil {
		t.Fatal(err)
	}
	if r := drv.Capabilities().Retry; r == nil || r.MaxAttempts != 2 || r.MinBackoff != 10*time.Millisecond {
		t.Fatalf("Capabilities().Retry = %+v, want the stored settings", r)
	}
	sub, err := subscribe.New(drv, &subscribe.Config{
		Workers: 2, Retry: policy.Retry{MaxAttempts: 5},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	var runs atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
			runs.Add(1)
			return errors.New("always fails")
		})
	}()
	sendBatch(t, tp, msg("A", "a1"))
	deadline := time.Now().Add(30 * time.Second)
	var dls []adaptersDeadLetter
	for {
		got, err := sub.DeadLetters(context.Background(), 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) > 0 {
			for _, d := range got {
				dls = append(dls, adaptersDeadLetter{d.Message.ID, d.Attempts})
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no dead letter after 30s; handler ran %d times", runs.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 2 || len(dls) != 1 || dls[0].attempts != 2 || sub.Retry().MaxAttempts != 2 {
		t.Fatalf("handler ran %d times, dead letters %+v, subscriber runs %+v; want 2 runs and a dead letter after 2 attempts",
			runs.Load(), dls, sub.Retry())
	}
}

// A subscription created without retry settings stores none (zeros): the
// consumer's Config decides, then the defaults. Reopening it asking for
// settings it does not store is a conflict.
func TestUnstatedRetrySettingsLeaveConfigToDecide(t *testing.T) {
	e := newEnv(t)
	e.topic("t", nil)
	drv := e.sub("t", "s", policy.Ordered, nil)
	if r := drv.Capabilities().Retry; r == nil || *r != (policy.Retry{}) {
		t.Fatalf("Capabilities().Retry = %+v, want stored zeros", r)
	}
	sub, err := subscribe.New(drv, &subscribe.Config{Retry: policy.Retry{MaxAttempts: 3, MinBackoff: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	want := policy.Retry{MaxAttempts: 3, MinBackoff: time.Second, MaxBackoff: policy.MaxBackoffDefault}
	if got := sub.Retry(); got != want {
		t.Fatalf("subscriber runs %+v, want %+v", got, want)
	}
	o := e.opts(nil)
	o.Create = true
	o.Subscription = &postgres.SubscriptionOptions{Ordering: policy.Ordered, MaxAttempts: 4}
	if _, err := postgres.OpenSubscription(context.Background(), e.pool, "t", "s", o); !errors.Is(err, keyorder.ErrInvalidConfig) {
		t.Fatalf("reopen asking MaxAttempts 4 = %v, want ErrInvalidConfig", err)
	}
}

type adaptersDeadLetter struct {
	id       string
	attempts int
}
