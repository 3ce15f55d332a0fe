package smoke

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/keyorder/keyorder/internal/testenv"
)

// TestPubSubOrderingKeys publishes messages over several ordering keys to a
// subscription with message ordering enabled and checks that each key's
// messages arrive in publish order.
func TestPubSubOrderingKeys(t *testing.T) {
	host := testenv.Require(t, testenv.PubSub)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const project = "keyorder-smoke"
	// PUBSUB_EMULATOR_HOST is set: the client connects to the emulator
	// without credentials.
	client, err := pubsub.NewClient(ctx, project)
	if err != nil {
		t.Fatalf("pubsub client for emulator %s: %v", host, err)
	}
	defer client.Close()

	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	topicName := fmt.Sprintf("projects/%s/topics/smoke-%s", project, suffix)
	subName := fmt.Sprintf("projects/%s/subscriptions/smoke-%s", project, suffix)
	if _, err := client.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topicName}); err != nil {
		t.Fatalf("create topic: %v", err)
	}
	if _, err := client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name:                  subName,
		Topic:                 topicName,
		EnableMessageOrdering: true,
		AckDeadlineSeconds:    30,
	}); err != nil {
		t.Fatalf("create subscription: %v", err)
	}

	const keys, perKey = 5, 20
	pub := client.Publisher(topicName)
	pub.EnableMessageOrdering = true
	var results []*pubsub.PublishResult
	for i := 0; i < perKey; i++ {
		for k := 0; k < keys; k++ {
			results = append(results, pub.Publish(ctx, &pubsub.Message{
				Data:        []byte(strconv.Itoa(i)),
				OrderingKey: fmt.Sprintf("key-%d", k),
			}))
		}
	}
	for _, r := range results {
		if _, err := r.Get(ctx); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	pub.Stop()

	var mu sync.Mutex
	got := map[string][]int{}
	total := 0
	rctx, rcancel := context.WithCancel(ctx)
	err = client.Subscriber(subName).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
		n, _ := strconv.Atoi(string(m.Data))
		mu.Lock()
		got[m.OrderingKey] = append(got[m.OrderingKey], n)
		total++
		if total >= keys*perKey {
			rcancel()
		}
		mu.Unlock()
		m.Ack()
	})
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatalf("timed out: received %d of %d messages", total, keys*perKey)
	}
	for k := 0; k < keys; k++ {
		key := fmt.Sprintf("key-%d", k)
		seq := got[key]
		if len(seq) != perKey {
			t.Errorf("%s: got %d messages, want %d: %v", key, len(seq), perKey, seq)
			continue
		}
		for i, n := range seq {
			if n != i {
				t.Errorf("%s: out of order: %v", key, seq)
				break
			}
		}
	}
}
