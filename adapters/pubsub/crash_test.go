package pubsub_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/adapters/pubsub"
	"github.com/keyorder/keyorder/integration/proctest"
	"github.com/keyorder/keyorder/internal/testenv"
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
	opts := &pubsub.SubscriptionOptions{Ordering: policy.Ordered, Lease: crashAckDeadline}
	if schema := os.Getenv(envStartSchema); schema != "" {
		pool, err := pgxpool.New(ctx, os.Getenv("KEYORDER_PG_URL"))
		if err != nil {
			return nil, err
		}
		if opts.StartStore, err = postgres.NewStartStore(pool, &postgres.StartStoreOptions{Schema: schema}); err != nil {
			return nil, err
		}
	}
	return pubsub.OpenSubscription(ctx, client, os.Getenv("KEYORDER_PUBSUB_SUB"), opts, p.Config)
}

// envStartSchema names the schema of the crash consumers' PostgreSQL start
// store; unset, they run without one.
const envStartSchema = "KEYORDER_START_SCHEMA"

// startStoreEnv migrates a fresh schema on the test PostgreSQL server
// (KEYORDER_PG_URL, which CI starts beside the emulator) and returns the
// consumers' environment naming it; the schema is dropped at the end.
func startStoreEnv(t *testing.T) []string {
	t.Helper()
	u := testenv.Require(t, testenv.Postgres)
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	schema := fmt.Sprintf("kostart_%d", rand.Uint32())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Logf("drop schema: %v", err)
		}
		pool.Close()
	})
	if _, err := postgres.Migrate(ctx, pool, postgres.DirectionUp, &postgres.MigrateOptions{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	return []string{"KEYORDER_PG_URL=" + u, envStartSchema + "=" + schema}
}

// crashScenario is sc against a fresh topic and Ordered subscription, its
// consumers given a PostgreSQL start store when withStore is set.
func crashScenario(t *testing.T, sc proctest.Scenario, withStore bool) proctest.Scenario {
	t.Helper()
	client := emulatorClient(t)
	ctx := t.Context()
	if withStore {
		sc.Env = append(sc.Env, startStoreEnv(t)...)
	}
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

// pubsubUnrunCause is why Pub/Sub without a start store dead-letters
// messages that never ran after crashes (issue 28, items 3 and 9), traced
// with this test on the emulator (KEYORDER_CRASH_KNOWN_BREAKS=1): the
// service counts every delivery (DeliveryAttempt), and a process the
// poison kills held other keys' messages it had received and not started
// (prefetch up to MaxOutstanding); each crash raised their count.
// Measured: the poison was dead-lettered after 3 runs, but k9-000 was
// dead-lettered "attempts exhausted (3) by lost leases" with 0 runs of its
// own (and its successors ran), and so was poison-001. Pub/Sub redelivers
// a message as published (no attribute can be written on it):
// SubscriptionOptions.StartStore gives it a store of the subscription's
// own, and TestPoisonKillsProcess and TestCrashChaos pass with one.
const pubsubUnrunCause = "Pub/Sub without a start store counts a crash against every message a dead process held, started or not (issue 28, items 3 and 9; docs/pubsub.md)"

// TestPoisonKillsProcess (issue 28, item 3): a message whose handler
// exits its process every time, two consumer processes restarted whenever
// they die, MaxAttempts 3, 40 other keys × 10 messages on the same
// subscription, the consumers sharing a PostgreSQL start store: the poison
// message is dead-lettered within MaxAttempts+1 runs, its key's later
// messages then run in order, every other key completes.
func TestPoisonKillsProcess(t *testing.T) {
	res := proctest.Run(t, crashScenario(t, proctest.Scenario{Poison: true, MaxAttempts: 3, Timeout: 120 * time.Second}, true))
	t.Logf("poison attempts %v, %d processes (%d ended by the poison), %d starts, %v",
		res.PoisonAttempts, res.Processes, res.PoisonExits, res.Starts, res.Elapsed)
}

// TestPoisonKillsProcessWithoutStartStore is TestPoisonKillsProcess
// without a start store: a known break (pubsubUnrunCause).
func TestPoisonKillsProcessWithoutStartStore(t *testing.T) {
	proctest.KnownBreak(t, pubsubUnrunCause)
	res := proctest.Run(t, crashScenario(t, proctest.Scenario{Poison: true, MaxAttempts: 3, Timeout: 120 * time.Second}, false))
	t.Logf("poison attempts %v, %d processes (%d ended by the poison), %d starts, %v",
		res.PoisonAttempts, res.Processes, res.PoisonExits, res.Starts, res.Elapsed)
}

// chaos is item 9's scenario: three consumer processes SIGKILLed at
// random, one attempt in ten failing, MaxAttempts 2.
var chaos = proctest.Scenario{
	Keys: 100, PerKey: 20, Consumers: 3, MaxAttempts: 2, FailP: 0.1, KillEvery: time.Second, Timeout: 150 * time.Second}

// TestCrashChaos (issue 28, item 9): three consumer processes SIGKILLed at
// random, one attempt in ten failing, MaxAttempts 2, the consumers sharing
// a PostgreSQL start store: nothing is dead-lettered unrun or before two
// runs of its own, no key's messages run out of order or at once, every
// message completes or is dead-lettered.
func TestCrashChaos(t *testing.T) {
	res := proctest.Run(t, crashScenario(t, chaos, true))
	t.Logf("%d processes, %d killed, %d starts, %d dead letters, %v", res.Processes, res.Kills, res.Starts, len(res.DeadLetters), res.Elapsed)
}

// TestCrashChaosWithoutStartStore is TestCrashChaos without a start
// store: a known break (pubsubUnrunCause); measured once with
// KEYORDER_CRASH_KNOWN_BREAKS=1 it passed (100 keys × 20, 12 SIGKILLs, 19
// dead letters, each after two runs of its own, 12 s), so the break shows
// with a crash-looping message, not reliably under random kills.
func TestCrashChaosWithoutStartStore(t *testing.T) {
	proctest.KnownBreak(t, pubsubUnrunCause)
	res := proctest.Run(t, crashScenario(t, chaos, false))
	t.Logf("%d processes, %d killed, %d starts, %d dead letters, %v", res.Processes, res.Kills, res.Starts, len(res.DeadLetters), res.Elapsed)
}
