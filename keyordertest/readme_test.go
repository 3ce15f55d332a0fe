package keyordertest_test

// TestLedgerKeepsOrder is the example of docs/testing.md ("Testing your own pipeline"),
// verbatim: TestDocsExampleIsReadmeTest keeps the two in step.

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/keyordertest"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

func TestLedgerKeepsOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { // fake clock: backoffs and leases take no time
		b := memory.NewBroker()
		b.CreateSubscription("ledger", "apply-balance", &memory.SubscriptionOptions{
			Ordering: policy.Ordered, Lease: 30 * time.Second,
		})
		pub, _ := b.OpenTopic("ledger", nil)
		defer pub.Close(context.Background())

		rec := keyordertest.NewRecorder(nil)
		cfg := &subscribe.Config{
			Workers: 4,
			Middleware: []subscribe.Middleware{
				rec.Middleware(), // outermost: records what the subscriber sees
				keyordertest.FailHandler(
					keyordertest.Fault{Payload: "101", Attempt: 1},                                 // fails once
					keyordertest.Fault{Payload: "201", Panic: "nil map", Times: 1},                 // panics once
					keyordertest.Fault{Payload: "203", Err: keyorder.Permanent(errors.New("bad"))}, // poison
				),
			},
		}
		c := keyordertest.StartConsumer(t, b, "apply-balance", cfg, applyAdjustment) // your handler

		for _, a := range []struct{ acct, id string }{
			{"acct-42", "101"}, {"acct-7", "201"}, {"acct-42", "102"},
			{"acct-7", "202"}, {"acct-7", "203"}, {"acct-42", "103"},
		} {
			m := &keyorder.Message{ID: keyorder.NewID(), Key: a.acct, Payload: []byte(a.id)}
			if _, err := pub.Publish(context.Background(), m); err != nil {
				t.Fatal(err)
			}
			rec.Published(m)
			if a.id == "102" {
				c = c.Restart() // the process dies mid-stream; its replacement takes over
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		if err := rec.WaitResolved(ctx); err != nil {
			t.Fatal(err)
		}
		keyordertest.Check(t, rec, keyordertest.Spec{Ordering: policy.Ordered})
	})
}

func applyAdjustment(ctx context.Context, d *keyorder.Delivery) error {
	time.Sleep(100 * time.Millisecond) // the work
	return nil
}
