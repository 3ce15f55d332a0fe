package pubsub_test

import (
	"context"
	"os"
	"testing"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/pubsub"
	"github.com/keyorder/keyorder/integration/proctest"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// The crash tests run consumers as real processes (integration/proctest): the
// test binary re-executed opens subscription KEYORDER_PUBSUB_SUB on the
// emulator (PUBSUB_EMULATOR_HOST, inherited).
func TestMain(m *testing.M) {
	proctest.Main(openCrashConsumer)
	os.Exit(m.Run())
}

// crashAckDeadline is the crash tests' ack deadline, the shortest Pub/Sub
// accepts: a dead consumer's messages come back after it.
const crashAckDeadline = pubsub.MinAckDeadline

func openCrashConsumer(ctx context.Context, p proctest.Params) (*subscribe.Subscriber, error) {
	client, err := gpubsub.NewClient(ctx, project)
	if err != nil {
		return nil, err
	}
	return pubsub.OpenSubscription(ctx, client, os.Getenv("KEYORDER_PUBSUB_SUB"),
		&pubsub.SubscriptionOptions{Ordering: policy.Ordered, Lease: crashAckDeadline}, p.Config)
}

// crashScenario is sc against a fresh topic and Ordered subscription.
func crashScenario(t *testing.T, sc proctest.Scenario) proctest.Scenario {
	t.Helper()
	client := emulatorClient(t)
	ctx := t.Context()
	topicID, subID := uniqueID("crash"), uniqueID("crash-s")
	if err := pubsub.CreateTopic(ctx, client, topicID); err != nil {
		t.Fatal(err)
	}
	opts := &pubsub.SubscriptionOptions{Ordering: policy.Ordered, Lease: crashAckDeadline}
	if err := pubsub.CreateSubscription(ctx, client, topicID, subID, opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteAll(client, topicID, subID) })
	pub, err := pubsub.OpenTopic(ctx, client, topicID, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close(context.Background()) })
	sub, err := pubsub.OpenSubscription(ctx, client, subID, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close(context.Background()) })
	sc.Env = append(sc.Env, "KEYORDER_PUBSUB_SUB="+subID)
	sc.Publish = func(ctx context.Context, ms []*keyorder.Message) error {
		_, err := pub.PublishBatch(ctx, ms)
		return err
	}
	sc.DeadLetters = func(ctx context.Context) ([]keyorder.DeadLetter, error) { return sub.DeadLetters(ctx, 0) }
	return sc
}

// pubsubUnrunCause is why Pub/Sub dead-letters messages that never ran
// after crashes (issue 28, items 3 and 9), traced with this test on the
// emulator (KEYORDER_CRASH_KNOWN_BREAKS=1): the service counts every
// delivery (DeliveryAttempt), and a process the poison kills held other
// keys' messages it had received and not started (prefetch up to
// MaxOutstanding); each crash raised their count. Measured: the poison was
// dead-lettered after 3 runs, but k9-000 was dead-lettered "attempts
// exhausted (3) by lost leases" with 0 runs of its own (and its successors
// ran), and so was poison-001. Pub/Sub redelivers a message as published
// (no attribute can be written on it), so recording starts needs a store
// of the subscription's own (see docs/pubsub.md).
const pubsubUnrunCause = "Pub/Sub counts a crash against every message a dead process held, started or not, and has nowhere to record starts (issue 28, items 3 and 9; docs/pubsub.md)"

// TestPoisonKillsProcess (issue 28, item 3): a message whose handler
// exits its process every time, two consumer processes restarted whenever
// they die, MaxAttempts 3, 40 other keys × 10 messages on the same
// subscription: the poison message is dead-lettered within MaxAttempts+1
// runs, its key's later messages then run in order, every other key
// completes.
func TestPoisonKillsProcess(t *testing.T) {
	proctest.KnownBreak(t, pubsubUnrunCause)
	res := proctest.Run(t, crashScenario(t, proctest.Scenario{Poison: true, MaxAttempts: 3, Timeout: 120 * time.Second}))
	t.Logf("poison attempts %v, %d processes (%d ended by the poison), %d starts, %v",
		res.PoisonAttempts, res.Processes, res.PoisonExits, res.Starts, res.Elapsed)
}

// TestCrashChaos (issue 28, item 9): three consumer processes SIGKILLed at
// random, one attempt in ten failing, MaxAttempts 2: nothing is
// dead-lettered unrun or before two runs of its own, no key's messages run
// out of order or at once, every message completes or is dead-lettered.
// Declared with the poison test's cause, which applies here too; measured
// once with KEYORDER_CRASH_KNOWN_BREAKS=1 it passed (100 keys × 20, 12
// SIGKILLs, 19 dead letters, each after two runs of its own, 12 s), so the
// break shows with a crash-looping message, not yet under random kills.
func TestCrashChaos(t *testing.T) {
	proctest.KnownBreak(t, pubsubUnrunCause)
	res := proctest.Run(t, crashScenario(t, proctest.Scenario{
		Keys: 100, PerKey: 20, Consumers: 3, MaxAttempts: 2, FailP: 0.1, KillEvery: time.Second, Timeout: 150 * time.Second}))
	t.Logf("%d processes, %d killed, %d starts, %d dead letters, %v", res.Processes, res.Kills, res.Starts, len(res.DeadLetters), res.Elapsed)
}
