package postgres_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// The typed constructors return the portable types; the Outbox publishes in
// the application's transaction; Stats, HeldKeys, DeadLetters and Redrive
// reach PostgreSQL's counts and dead letters through the Subscriber.
func TestPortableConstructorsAndOutbox(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t, 60*time.Second)
	opts := e.opts(&postgres.Options{Create: true, Subscription: &postgres.SubscriptionOptions{Ordering: policy.Ordered, MaxAttempts: 1}})
	pub, err := postgres.OpenTopic(ctx, e.pool, "ledger", opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(context.Background())
	if l := pub.Limits(); l.Backend != "postgres" || l.MaxKeyBytes == 0 {
		t.Fatalf("Limits() = %+v", l)
	}
	sub, err := postgres.OpenSubscription(ctx, e.pool, "ledger", "apply", opts, &subscribe.Config{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	if caps := sub.Capabilities(); caps.Ordering != policy.Ordered || !caps.NativeHold {
		t.Fatalf("Capabilities() = %+v", caps)
	}
	ob, err := postgres.OpenOutbox(ctx, e.pool, "ledger", opts)
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		return ob.PublishTx(ctx, tx, &keyorder.Message{ID: "poison", Key: "acct", Payload: []byte("p")})
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(ctx, &keyorder.Message{ID: "ok", Key: "acct", Payload: []byte("o")}); err != nil {
		t.Fatal(err)
	}
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		return ob.PublishTx(ctx, tx, &keyorder.Message{Key: "acct", Payload: []byte("late")})
	})
	if !errors.Is(err, keyorder.ErrClosed) {
		t.Fatalf("PublishTx after Close = %v, want ErrClosed", err)
	}

	var mu sync.Mutex
	var handled []string
	done := make(chan error, 1)
	go func() {
		done <- sub.Run(ctx, func(ctx context.Context, d *keyorder.Delivery) error {
			mu.Lock()
			handled = append(handled, d.ID)
			mu.Unlock()
			if d.Subscription != "apply" {
				t.Errorf("Delivery.Subscription = %q, want the subscription's name", d.Subscription)
			}
			if d.ID == "poison" {
				return errors.New("cannot apply")
			}
			return nil
		})
	}()
	for {
		st, err := sub.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Acked == 1 && st.DeadLettered == 1 {
			if b := st.Backend; b == nil || b.Dead != 1 || b.Pending != 0 || b.Keys != 0 || b.HeldKeys != 0 {
				t.Fatalf("backend stats %+v, want one dead letter and nothing pending", b)
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("stats %+v", st)
		case <-time.After(50 * time.Millisecond):
		}
	}
	keys, err := sub.HeldKeys(ctx, 0)
	if err != nil || len(keys) != 0 {
		t.Fatalf("HeldKeys = %v, %v; want none", keys, err)
	}
	dls, err := sub.DeadLetters(ctx, 0)
	if err != nil || len(dls) != 1 || dls[0].Message.ID != "poison" || dls[0].Message.Key != "acct" ||
		dls[0].Message.Headers[keyorder.HeaderPartitionKey] != "acct" || dls[0].Attempts != 1 {
		t.Fatalf("DeadLetters = %+v, %v", dls, err)
	}
	if err := sub.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(handled) != 2 || handled[0] != "poison" || handled[1] != "ok" {
		t.Fatalf("handled %v, want poison then ok", handled)
	}
}
