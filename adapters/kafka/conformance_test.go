package kafka_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyorder/keyorder/adapters/kafka"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/integration"
	"github.com/keyorder/keyorder/integration/testenv"
)

var seq atomic.Int64

// uniqueName returns a topic or group name no other case or run uses.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano(), seq.Add(1))
}

// brokers returns the test broker's seed list (KEYORDER_KAFKA_BROKERS);
// it skips the test without one, or fails it under CI=true or the
// launcher.
func brokers(t testing.TB) []string {
	t.Helper()
	return strings.Split(testenv.Require(t, testenv.Kafka), ",")
}

// newClient returns a client of the test broker, closed with the test.
func newClient(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers(t)...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// createTopic creates a topic with partitions partitions.
func createTopic(ctx context.Context, t testing.TB, cl *kgo.Client, partitions int32) string {
	t.Helper()
	name := uniqueName("t")
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, partitions, 1, nil, name)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	return name
}

// subOptions are the options of the tests' subscriptions: a short session
// timeout, so a killed member's partitions move within seconds.
func subOptions(t testing.TB, spec integration.Spec) *kafka.SubscriptionOptions {
	return &kafka.SubscriptionOptions{
		Ordering: spec.Ordering, Lease: spec.LeaseDuration,
		SessionTimeout: 6 * time.Second, CommitInterval: 200 * time.Millisecond,
		ClientOptions: []kgo.Opt{kgo.SeedBrokers(brokers(t)...)},
	}
}

// conformancePartitions is the partition count of the suite's topics:
// several, as users run, so that keys of a case spread over partitions.
const conformancePartitions = 4

// harness runs the suite on the KRaft broker; each case gets its own topic
// (conformancePartitions partitions) and group, and each consumer its own
// client (as a separate process would).
//
// The suite's schedules compare messages of different keys by publish
// order (WorkedExample: the oldest deliverable runs first;
// PublishDelayHoldsGroup: b1 before the delayed a1). Kafka orders records
// only within a partition; the driver hands out the records fetched
// together merged by record timestamp (handOut), so what a case published
// before its consumer started reaches the process in publish order.
type harness struct{ client *kgo.Client }

func (h *harness) Capabilities() integration.Capabilities {
	return integration.Capabilities{Unit: 250 * time.Millisecond, Unsupported: map[string]string{"CompactionDeliversNewest": noCompaction}}
}

func (h *harness) MakePair(ctx context.Context, t *testing.T, spec integration.Spec) (*integration.Pair, error) {
	topicName := createTopic(ctx, t, h.client, conformancePartitions)
	group := uniqueName("g")
	opts := subOptions(t, spec)
	if os.Getenv("KEYORDER_KAFKA_TRACE") != "" {
		tr := newTraceLog(t)
		opts.ClientOptions = append(opts.ClientOptions, tr.opts()...)
		t.Cleanup(func() {
			tr.mu.Lock()
			defer tr.mu.Unlock()
			t.Logf("first batch fetched per partition %v; requests %v", tr.batches, tr.writes)
		})
	}
	topic, err := kafka.OpenTopicDriver(ctx, h.client, topicName, nil)
	if err != nil {
		return nil, err
	}
	return &integration.Pair{
		Topic: topic,
		OpenConsumer: func(ctx context.Context) (driver.Subscription, error) {
			return kafka.OpenSubscriptionDriver(ctx, topicName, group, opts)
		},
	}, nil
}

func TestConformance(t *testing.T) {
	integration.Run(t, &harness{client: newClient(t)})
}

// noCompaction is why a Kafka subscription cannot compact as keyorder
// means it.
const noCompaction = "Kafka's log compaction (cleanup.policy=compact) keeps the newest record per key in the log " +
	"when the log cleaner runs over closed segments, not when a key becomes free in a consumer group: " +
	"a group reads every record below the cleaner's point, and none is superseded while it waits"
