package pulsar_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	gopulsar "github.com/apache/pulsar-client-go/pulsar"
	pulsarlog "github.com/apache/pulsar-client-go/pulsar/log"

	"github.com/keyorder/keyorder/adapters/pulsar"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/integration/drivertest"
	"github.com/keyorder/keyorder/internal/testenv"
)

var seq atomic.Int64

// uniqueTopic returns a topic name no other case or run uses.
func uniqueTopic(prefix string) string {
	return fmt.Sprintf("persistent://public/default/%s-%d-%d", prefix, time.Now().UnixNano(), seq.Add(1))
}

// newClient connects to the test broker (KEYORDER_PULSAR_URL).
func newClient(t testing.TB) gopulsar.Client {
	t.Helper()
	url := testenv.Require(t, testenv.Pulsar)
	c, err := gopulsar.NewClient(gopulsar.ClientOptions{
		URL: url, OperationTimeout: 30 * time.Second, ConnectionTimeout: 10 * time.Second,
		Logger: pulsarlog.NewLoggerWithSlog(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// harness runs the suite on the standalone broker; each case gets its own
// topic and subscription, and each consumer its own client (as a separate
// process would).
type harness struct{ client gopulsar.Client }

func (h *harness) Capabilities() drivertest.Capabilities {
	return drivertest.Capabilities{Unit: 250 * time.Millisecond, Unsupported: map[string]string{"CompactionDeliversNewest": noCompaction}}
}

func (h *harness) MakePair(ctx context.Context, t *testing.T, spec drivertest.Spec) (*drivertest.Pair, error) {
	topicName := uniqueTopic("t")
	opts := &pulsar.SubscriptionOptions{
		Ordering: spec.Ordering, Lease: spec.LeaseDuration,
		AdminURL: os.Getenv("KEYORDER_PULSAR_ADMIN_URL"),
	}
	topic, err := pulsar.OpenTopicDriver(ctx, h.client, topicName, nil)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { topic.Close() })
	return &drivertest.Pair{
		Topic: topic,
		OpenConsumer: func(ctx context.Context) (driver.Subscription, error) {
			c := newClient(t)
			return pulsar.OpenSubscriptionDriver(ctx, c, topicName, "s", opts)
		},
	}, nil
}

func TestConformance(t *testing.T) {
	drivertest.Run(t, &harness{client: newClient(t)})
}

// noCompaction is why a Pulsar subscription cannot compact as keyorder means it.
const noCompaction = "Pulsar's topic compaction (latest value per key) runs when triggered or over a size threshold, " +
	"not when a key becomes free, and is read only with ReadCompacted on Exclusive or Failover " +
	"subscriptions, while keyorder consumes with Key_Shared to keep keys on consumers; a Key_Shared " +
	"consumer acknowledges only what it was delivered"
