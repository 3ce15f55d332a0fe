package postgres_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/integration/proctest"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// openCrashConsumer opens subscription "s" of KEYORDER_PG_TOPIC in a
// proctest consumer process, with a 1 s lease so that a dead consumer's
// messages come back soon.
func openCrashConsumer(ctx context.Context, p proctest.Params) (*subscribe.Subscriber, error) {
	pool, err := pgxpool.New(ctx, os.Getenv("KEYORDER_PG_URL"))
	if err != nil {
		return nil, err
	}
	return postgres.OpenSubscription(ctx, pool, os.Getenv("KEYORDER_PG_TOPIC"), "s", &postgres.Options{
		Schema: os.Getenv("KEYORDER_PG_SCHEMA"), Lease: time.Second, PollInterval: 50 * time.Millisecond,
	}, p.Config)
}

// crashScenario is sc against a fresh Ordered subscription "s" of topic
// "t" in e's schema.
func crashScenario(t *testing.T, e *env, sc proctest.Scenario) proctest.Scenario {
	t.Helper()
	ctx := context.Background()
	pub, err := postgres.OpenTopic(ctx, e.pool, "t", e.opts(&postgres.Options{Create: true}), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close(context.Background()) })
	sub, err := postgres.OpenSubscription(ctx, e.pool, "t", "s", e.opts(&postgres.Options{
		Create: true, Subscription: &postgres.SubscriptionOptions{Ordering: policy.Ordered}}), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close(context.Background()) })
	sc.Env = append(sc.Env, "KEYORDER_PG_URL="+e.url, "KEYORDER_PG_SCHEMA="+e.schema, "KEYORDER_PG_TOPIC=t")
	sc.Publish = func(ctx context.Context, ms []*keyorder.Message) error {
		_, err := pub.PublishBatch(ctx, ms)
		return err
	}
	sc.DeadLetters = func(ctx context.Context) ([]keyorder.DeadLetter, error) { return sub.DeadLetters(ctx, 0) }
	return sc
}

// TestPoisonKillsProcess (issue 28, item 3): a message whose handler
// exits its process every time, two consumer processes restarted whenever
// they die, MaxAttempts 3, 40 other keys × 10 messages on the same
// subscription: the poison message is dead-lettered within MaxAttempts+1
// runs, its key's later messages then run in order, every other key
// completes. Measured: runs with attempts [1 1 2 3] (the first run is
// killed before its lazy start mark lands, the next is claimed as suspect
// and marked before it runs), then dead-lettered. With the suspect's
// synchronous mark turned off (Started not waiting for it) the test fails
// with [1 1 1 2 3]: the past failure of this scenario on PostgreSQL.
func TestPoisonKillsProcess(t *testing.T) {
	e := newEnv(t)
	res := proctest.Run(t, crashScenario(t, e, proctest.Scenario{Poison: true, MaxAttempts: 3, Timeout: 90 * time.Second}))
	t.Logf("poison attempts %v, %d processes (%d ended by the poison), %d starts, %v",
		res.PoisonAttempts, res.Processes, res.PoisonExits, res.Starts, res.Elapsed)
}

// TestCrashChaos (issue 28, item 9): three consumer processes SIGKILLed at
// random, one attempt in ten failing, MaxAttempts 2: nothing is
// dead-lettered unrun or before two runs of its own, no key's messages run
// out of order or at once, every message completes or is dead-lettered.
func TestCrashChaos(t *testing.T) {
	e := newEnv(t)
	res := proctest.Run(t, crashScenario(t, e, proctest.Scenario{
		Keys: 100, PerKey: 30, Consumers: 3, MaxAttempts: 2, FailP: 0.1, KillEvery: 400 * time.Millisecond, Timeout: 90 * time.Second}))
	t.Logf("%d processes, %d killed, %d starts, %d dead letters, %v", res.Processes, res.Kills, res.Starts, len(res.DeadLetters), res.Elapsed)
}
