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
	"github.com/keyorder/keyorder/integration/drivertest"
	"github.com/keyorder/keyorder/internal/testenv"
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

// createTopic creates a topic with partitions partitions and waits until
// the broker leads every one of them.
//
// CreateTopics returns, and Metadata names the broker as each partition's
// leader, before the broker has made itself leader of the new partitions
// (KRaft brokers apply the topic's records asynchronously): until then a
// Produce or ListOffsets for the partition fails with
// NOT_LEADER_OR_FOLLOWER. franz-go retries a produce after its backoff
// (a case's first publish took 574 ms instead of ~20 ms, eating into the
// delays the suite measures from before it) and a consumer's start-offset
// load after a second. So the harness waits, as a deployment's topics
// are ready long before they are used.
func createTopic(ctx context.Context, t testing.TB, cl *kgo.Client, partitions int32) string {
	t.Helper()
	name := uniqueName("t")
	adm := kadm.NewClient(cl)
	resp, err := adm.CreateTopic(ctx, partitions, 1, nil, name)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ends, err := adm.ListEndOffsets(ctx, name)
		if err == nil {
			err = ends.Error()
		}
		if err == nil && len(ends[name]) == int(partitions) {
			return name
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("topic %s: partitions not led after 30s: %v", name, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// subOptions are the options of the tests' subscriptions: a short session
// timeout, so a killed member's partitions move within seconds.
func subOptions(t testing.TB, spec drivertest.Spec) *kafka.SubscriptionOptions {
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
// Two of the suite's schedules compare messages of different keys by
// publish order (WorkedExample: the oldest deliverable runs first;
// PublishDelayHoldsGroup: b1 before the delayed a1), and Kafka orders
// records only within a partition. They pass on several partitions
// because of two things, each traced to a failure on 4 partitions:
//
//   - The driver hands out the records fetched together merged by record
//     timestamp (handOut). Handing out each partition's backlog in turn,
//     WorkedExample failed 6 runs in 8 (s2 handed out before b1; every
//     partition's first batch came in one fetch).
//   - createTopic waits until the broker leads every partition. Without
//     it a case's first publish could be retried (NOT_LEADER_OR_FOLLOWER,
//     then franz-go's backoff: a1's publish took 574 ms, counted in the
//     delay PublishDelayHoldsGroup measures from before it, so a1 was due
//     when its group arrived and ran first), and a member that joined
//     early loaded some partitions' start offsets a second late (see
//     TestFreshGroupFirstRecords).
//
// KEYORDER_KAFKA_TRACE=1 logs each case's request counts and per-partition
// first fetches, =debug also franz-go's debug log (the producer's at once,
// a member's when the case fails).
type harness struct{ client *kgo.Client }

func (h *harness) Capabilities() drivertest.Capabilities {
	return drivertest.Capabilities{Unit: 250 * time.Millisecond, Unsupported: map[string]string{"CompactionDeliversNewest": noCompaction}}
}

func (h *harness) MakePair(ctx context.Context, t *testing.T, spec drivertest.Spec) (*drivertest.Pair, error) {
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
			if t.Failed() {
				tr.mu.Unlock()
				tr.dump()
				tr.mu.Lock()
			}
		})
	}
	topic, err := kafka.OpenTopicDriver(ctx, h.client, topicName, nil)
	if err != nil {
		return nil, err
	}
	var tp driver.Topic = topic
	if os.Getenv("KEYORDER_KAFKA_TRACE") != "" {
		tp = timedTopic{topic, t}
	}
	return &drivertest.Pair{
		Topic: tp,
		OpenConsumer: func(ctx context.Context) (driver.Subscription, error) {
			return kafka.OpenSubscriptionDriver(ctx, topicName, group, opts)
		},
	}, nil
}

func TestConformance(t *testing.T) {
	var opts []kgo.Opt
	if os.Getenv("KEYORDER_KAFKA_TRACE") == "debug" {
		tr := newTraceLog(t)
		tr.live = "producer"
		opts = tr.opts()
	}
	drivertest.Run(t, &harness{client: newClient(t, opts...)})
}

// noCompaction is why a Kafka subscription cannot compact as keyorder
// means it.
const noCompaction = "Kafka's log compaction (cleanup.policy=compact) keeps the newest record per key in the log " +
	"when the log cleaner runs over closed segments, not when a key becomes free in a consumer group: " +
	"a group reads every record below the cleaner's point, and none is superseded while it waits"

// timedTopic logs how long each SendBatch took (KEYORDER_KAFKA_TRACE).
type timedTopic struct {
	driver.Topic
	t *testing.T
}

func (tt timedTopic) SendBatch(ctx context.Context, ms []*driver.Message) error {
	start := time.Now()
	err := tt.Topic.SendBatch(ctx, ms)
	fmt.Printf("%s SendBatch of %d (first %q) took %v\n", time.Now().Format("15:04:05.000"), len(ms), ms[0].Payload, time.Since(start).Round(time.Millisecond))
	return err
}
