package kafka_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/kafka"
	"github.com/keyorder/keyorder/integration/proctest"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// openCrashConsumer opens a member of group KEYORDER_KAFKA_GROUP of
// KEYORDER_KAFKA_TOPIC in a proctest consumer process, with the broker's
// shortest session timeout (6 s) so that a dead member's partitions move
// soon, and the default commit interval (a start is recorded lazily).
func openCrashConsumer(ctx context.Context, p proctest.Params) (*subscribe.Subscriber, error) {
	return kafka.OpenSubscription(ctx, os.Getenv("KEYORDER_KAFKA_TOPIC"), os.Getenv("KEYORDER_KAFKA_GROUP"), &kafka.SubscriptionOptions{
		Ordering: policy.Ordered, SessionTimeout: 6 * time.Second,
		ClientOptions: []kgo.Opt{kgo.SeedBrokers(strings.Split(os.Getenv("KEYORDER_KAFKA_BROKERS"), ",")...)},
		Logger:        p.Config.Logger,
	}, p.Config)
}

// TestPoisonKillsProcess (issue 28, item 3): a record whose handler exits
// its process every time, two consumer processes restarted whenever they
// die, MaxAttempts 3, 40 other keys × 10 records on a 4-partition topic:
// the poison record is dead-lettered within MaxAttempts+1 runs, its key's
// later records then run in order, every other key completes. Before the
// driver recorded starts (lazily, and synchronously for records of a
// partition whose previous owner died) and ran charged records alone, the
// poison record ran 25 times in 150 s, every run attempt 1, and 120 of the
// 400 other records never completed.
func TestPoisonKillsProcess(t *testing.T) {
	ctx := context.Background()
	cl := newClient(t)
	topicName := createTopic(ctx, t, cl, 4)
	group := uniqueName("g")
	pub, err := kafka.OpenTopic(ctx, cl, topicName, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close(context.Background()) })
	admin, err := kafka.OpenSubscription(ctx, topicName, group, &kafka.SubscriptionOptions{
		ClientOptions: []kgo.Opt{kgo.SeedBrokers(brokers(t)...)},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	res := proctest.Run(t, proctest.Scenario{
		Env: []string{"KEYORDER_KAFKA_TOPIC=" + topicName, "KEYORDER_KAFKA_GROUP=" + group,
			"KEYORDER_KAFKA_BROKERS=" + strings.Join(brokers(t), ",")},
		Publish: func(ctx context.Context, ms []*keyorder.Message) error {
			_, err := pub.PublishBatch(ctx, ms)
			return err
		},
		DeadLetters: func(ctx context.Context) ([]keyorder.DeadLetter, error) { return admin.DeadLetters(ctx, 0) },
		Poison:      true, MaxAttempts: 3, Timeout: 100 * time.Second,
	})
	t.Logf("poison attempts %v, %d processes (%d ended by the poison), %d starts, %v",
		res.PoisonAttempts, res.Processes, res.PoisonExits, res.Starts, res.Elapsed)
}
