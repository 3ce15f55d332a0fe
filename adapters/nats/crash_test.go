package nats_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyorder/keyorder"
	kn "github.com/keyorder/keyorder/adapters/nats"
	"github.com/keyorder/keyorder/integration/proctest"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// TestMain makes the test binary a crash-test consumer process when
// proctest starts it as one.
func TestMain(m *testing.M) {
	proctest.Main(openCrashConsumer)
	os.Exit(m.Run())
}

// crashLease is the crash test's lease: a killed process's partitions
// move one and a half leases after its last renewal.
const crashLease = 2 * time.Second

func openCrashConsumer(ctx context.Context, p proctest.Params) (*subscribe.Subscriber, error) {
	nc, err := nats.Connect(os.Getenv("KEYORDER_NATS_URL"))
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return kn.OpenSubscription(ctx, js, os.Getenv("KEYORDER_NATS_STREAM"), "crash",
		&kn.SubscriptionOptions{Ordering: policy.Ordered, Lease: crashLease}, p.Config)
}

// TestCrashChaos: three consumer processes of one subscription, one
// SIGKILLed at random every 0.25-0.75 s and restarted (a new process joining),
// handlers failing one attempt in ten: every message completes, a key's
// in publish order, no two attempts of a key overlap (proctest checks).
// The retry budget is high: a process killed with messages fetched but
// not run gives them back counted (docs/nats.md, "What survives a crash").
func TestCrashChaos(t *testing.T) {
	js := connect(t)
	ctx := context.Background()
	stream := uniqueName("crash")
	if _, err := kn.EnsureStream(ctx, js, stream, conformancePartitions); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = js.DeleteStream(context.Background(), stream)
		_ = js.DeleteStream(context.Background(), kn.DeadLetterStream(stream))
	})
	pub, err := kn.OpenTopic(ctx, js, stream, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close(context.Background()) })
	sub, err := kn.OpenSubscription(ctx, js, stream, "crash", &kn.SubscriptionOptions{Lease: crashLease}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close(context.Background()) })
	res := proctest.Run(t, proctest.Scenario{
		Env: []string{"KEYORDER_NATS_URL=" + os.Getenv("KEYORDER_NATS_URL"), "KEYORDER_NATS_STREAM=" + stream},
		Publish: func(ctx context.Context, ms []*keyorder.Message) error {
			_, err := pub.PublishBatch(ctx, ms)
			return err
		},
		DeadLetters: func(ctx context.Context) ([]keyorder.DeadLetter, error) { return sub.DeadLetters(ctx, 0) },
		Keys:        100, PerKey: 60, Consumers: 3, MaxAttempts: 100, FailP: 0.1,
		KillEvery: 500 * time.Millisecond, Timeout: 90 * time.Second,
	})
	t.Logf("%d processes, %d killed, %d starts, %d dead letters, %v", res.Processes, res.Kills, res.Starts, len(res.DeadLetters), res.Elapsed)
	if res.Kills == 0 {
		t.Errorf("no process was killed mid-stream: the run proved nothing about crashes")
	}
}
