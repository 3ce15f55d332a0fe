package pubsub_test

import (
	"context"
	"testing"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"

	"github.com/keyorder/keyorder/adapters/pubsub"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// TestReturnKeepsDelay (issue 28, item 2): a message that ran and waits
// for an in-process retry, given back at a graceful stop with Return, is
// redelivered when its retry is due (its ack deadline set to the remaining
// delay), not at once as Release would, on Google's emulator and on
// pstest. The attempt it carries is the service's count of deliveries
// (a1@2, whatever Attempts says): Return cannot raise it.
func TestReturnKeepsDelay(t *testing.T) {
	for _, srv := range []struct {
		name   string
		client func(*testing.T) *gpubsub.Client
	}{{"emulator", emulatorClient}, {"pstest", pstestClient}} {
		t.Run(srv.name, func(t *testing.T) {
			client := srv.client(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			topicID, subID := uniqueID("ret"), uniqueID("ret-s")
			if err := pubsub.CreateTopic(ctx, client, topicID); err != nil {
				t.Fatal(err)
			}
			opts := &pubsub.SubscriptionOptions{Ordering: policy.Ordered, Lease: pubsub.MinAckDeadline}
			if err := pubsub.CreateSubscription(ctx, client, topicID, subID, opts); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { deleteAll(client, topicID, subID) })
			topic, err := pubsub.OpenTopicDriver(ctx, client, topicID, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { topic.Close() })
			sub, err := pubsub.OpenSubscriptionDriver(ctx, client, subID, opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sub.Close() })
			if err := topic.SendBatch(ctx, []*driver.Message{{ID: "a1", Key: "A", Payload: []byte("a1")}}); err != nil {
				t.Fatal(err)
			}
			ms, err := sub.Receive(ctx, 1)
			if err != nil || len(ms) != 1 || ms[0].ID != "a1" {
				t.Fatalf("Receive = %v, %v", ms, err)
			}
			r, ok := any(sub).(driver.Returner)
			if !ok {
				t.Fatal("the Pub/Sub subscription driver does not implement driver.Returner")
			}
			due := time.Now().Add(3 * time.Second)
			if err := r.Return(ctx, []driver.Returned{{Message: ms[0], Attempts: 2, NotBefore: due}}); err != nil {
				t.Fatal(err)
			}
			again, err := sub.Receive(ctx, 1)
			if err != nil || len(again) != 1 || again[0].ID != "a1" {
				t.Fatalf("after Return Receive = %v, %v", again, err)
			}
			if early := time.Until(due); early > 0 {
				t.Fatalf("a1 redelivered %v before its retry was due", early)
			}
			if again[0].Attempt != 2 {
				t.Fatalf("a1 redelivered as attempt %d, want 2 (the service's count of deliveries)", again[0].Attempt)
			}
			if err := sub.Ack(ctx, again); err != nil {
				t.Fatal(err)
			}
		})
	}
}
