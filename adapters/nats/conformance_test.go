package nats_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	kn "github.com/keyorder/keyorder/adapters/nats"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/integration/drivertest"
	"github.com/keyorder/keyorder/internal/testenv"
)

var seq atomic.Int64

// uniqueName returns a stream or subscription name no other case or run
// uses.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s_%d_%d", prefix, time.Now().UnixNano()%1e9, seq.Add(1))
}

// connect returns a JetStream context on the test server, closed with the
// test; it skips without a server (fails under CI or the launcher).
func connect(t testing.TB) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(testenv.Require(t, testenv.NATS))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// conformancePartitions is the partition count of the suite's streams:
// several, so that a case's keys spread over partitions.
const conformancePartitions = 4

// testLease is the lease of cases that do not ask for one: short, so that
// ownership moves within a second or two between a case's consumers.
const testLease = 2 * time.Second

// harness runs the suite on nats-server; each case gets its own stream and
// subscription, and each consumer its own connection (as a separate
// process would).
type harness struct{ js jetstream.JetStream }

func (h *harness) Capabilities() drivertest.Capabilities {
	return drivertest.Capabilities{Unit: 250 * time.Millisecond, Unsupported: map[string]string{"CompactionDeliversNewest": noCompaction}}
}

func (h *harness) MakePair(ctx context.Context, t *testing.T, spec drivertest.Spec) (*drivertest.Pair, error) {
	// The cases run in parallel (as many at once as go test's -parallel,
	// GOMAXPROCS by default): each has its own stream, subscription and
	// connections, and most of a case's time is waiting out leases and
	// retry delays. MakePair is the first thing a case does, so nothing of
	// it has started while it waits for its turn.
	t.Parallel()
	stream := uniqueName("S")
	if _, err := kn.EnsureStream(ctx, h.js, stream, conformancePartitions); err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = h.js.DeleteStream(ctx, stream)
		_ = h.js.DeleteStream(ctx, kn.DeadLetterStream(stream))
	})
	sub := uniqueName("sub")
	topic, err := kn.OpenTopicDriver(ctx, h.js, stream, nil)
	if err != nil {
		return nil, err
	}
	lease := spec.LeaseDuration
	if lease == 0 {
		lease = testLease
	}
	return &drivertest.Pair{
		Topic: topic,
		OpenConsumer: func(ctx context.Context) (driver.Subscription, error) {
			js := connect(t)
			return kn.OpenSubscriptionDriver(ctx, js, stream, sub, &kn.SubscriptionOptions{Ordering: spec.Ordering, Lease: lease})
		},
	}, nil
}

func TestConformance(t *testing.T) {
	t.Parallel() // the module's tests overlap: most of their time is waiting for leases
	drivertest.Run(t, &harness{js: connect(t)})
}

// noCompaction is why a NATS subscription cannot compact as keyorder
// means it.
const noCompaction = "JetStream's per-subject limit (MaxMsgsPerSubject: 1) keeps the newest message per key in the stream " +
	"for every consumer at once, whether a key is free in this subscription or not: a message another subscription has " +
	"not read yet would be dropped, and none is superseded while it waits"
