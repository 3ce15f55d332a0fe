package nats_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
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

// crashLease is the crash tests' lease, the shortest there is: a killed
// process's partitions move one and a half leases after its last renewal.
const crashLease = time.Second

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
		&kn.SubscriptionOptions{Ordering: policy.Ordered, Lease: crashLease, Logger: p.Config.Logger}, p.Config)
}

// crashScenario is sc against a fresh stream and its subscription "crash".
func crashScenario(t *testing.T, sc proctest.Scenario) proctest.Scenario {
	t.Helper()
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
	sc.Env = append(sc.Env, "KEYORDER_NATS_URL="+os.Getenv("KEYORDER_NATS_URL"), "KEYORDER_NATS_STREAM="+stream)
	sc.Publish = func(ctx context.Context, ms []*keyorder.Message) error {
		_, err := pub.PublishBatch(ctx, ms)
		return err
	}
	sc.DeadLetters = func(ctx context.Context) ([]keyorder.DeadLetter, error) { return sub.DeadLetters(ctx, 0) }
	return sc
}

// TestCrashChaos: three consumer processes of one subscription, one
// SIGKILLed at random every 0.25-0.75 s and restarted (a new process joining),
// handlers failing one attempt in ten, MaxAttempts 2: every message
// completes or is dead-lettered after two runs of its own (none unrun or
// early: a message that waited unrun in a killed process comes back
// uncounted), a key's in publish order, no two attempts of a key overlap
// (proctest checks).
func TestCrashChaos(t *testing.T) {
	t.Parallel() // the module's tests overlap: most of their time is waiting for leases
	res := proctest.Run(t, crashScenario(t, proctest.Scenario{
		Keys: 100, PerKey: 40, Consumers: 3, MaxAttempts: 2, FailP: 0.1,
		KillEvery: 500 * time.Millisecond, Timeout: 90 * time.Second,
	}))
	t.Logf("%d processes, %d killed, %d starts, %d dead letters, %v", res.Processes, res.Kills, res.Starts, len(res.DeadLetters), res.Elapsed)
	if res.Kills == 0 {
		t.Errorf("no process was killed mid-stream: the run proved nothing about crashes")
	}
}

// TestPoisonKillsProcess (issue 28, item 3): a message whose handler
// exits its process every time, two consumer processes restarted whenever
// they die, MaxAttempts 3, 40 other keys × 10 messages on the same
// subscription: the poison message is dead-lettered within MaxAttempts+1
// runs, its key's later messages then run in order, every other key
// completes (proctest checks).
func TestPoisonKillsProcess(t *testing.T) {
	t.Parallel() // the module's tests overlap: most of their time is waiting for leases
	res := proctest.Run(t, crashScenario(t, proctest.Scenario{Poison: true, MaxAttempts: 3, Timeout: 60 * time.Second}))
	t.Logf("poison attempts %v, %d processes (%d ended by the poison), %d starts, %v",
		res.PoisonAttempts, res.Processes, res.PoisonExits, res.Starts, res.Elapsed)
}

// TestGracefulRestartsKeepAttemptsAndDelay: a message that fails every run
// with a 1.5 s retry delay, its process stopped gracefully each time while
// the message waits for its retry. The subscriber gives it back with
// Return, and the next process runs it at the next attempt, not before the
// retry time: attempts 1, 2, 3, then dead-lettered under MaxAttempts 3,
// and the key's next message runs once, after.
func TestGracefulRestartsKeepAttemptsAndDelay(t *testing.T) {
	t.Parallel() // the module's tests overlap: most of their time is waiting for leases
	js := connect(t)
	ctx := context.Background()
	stream := uniqueName("graceful")
	if _, err := kn.EnsureStream(ctx, js, stream, 2); err != nil {
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
	defer pub.Close(ctx)
	for _, p := range []string{"m1", "m2"} {
		if _, err := pub.Publish(ctx, &keyorder.Message{Key: "k", Payload: []byte(p)}); err != nil {
			t.Fatal(err)
		}
	}
	const delay = 1500 * time.Millisecond
	var mu sync.Mutex
	var attempts []int
	var ranAt []time.Time
	m2 := 0
	h := func(ctx context.Context, d *keyorder.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		if string(d.Payload) != "m1" {
			m2++
			return nil
		}
		attempts = append(attempts, d.Attempt)
		ranAt = append(ranAt, time.Now())
		return keyorder.RetryAfter(errors.New("poison"), delay)
	}
	runs := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(attempts)
	}
	for n := 1; n <= 3; n++ {
		sub, err := kn.OpenSubscription(ctx, connect(t), stream, "g", &kn.SubscriptionOptions{Lease: testLease}, &subscribe.Config{
			ShutdownTimeout: 5 * time.Second,
			Retry:           policy.Retry{MaxAttempts: 3, MinBackoff: delay, MaxBackoff: delay, NoJitter: true},
		})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- sub.Run(context.Background(), h) }()
		waitFor(t, 30*time.Second, fmt.Sprintf("m1's run %d", n), func() bool { return runs() >= n })
		if n == 3 {
			waitFor(t, 30*time.Second, "m2", func() bool { mu.Lock(); defer mu.Unlock(); return m2 > 0 })
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = sub.Close(cctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(attempts, []int{1, 2, 3}) {
		t.Fatalf("m1 ran at attempts %v over graceful restarts; want [1 2 3]", attempts)
	}
	for i := 1; i < len(ranAt); i++ {
		if gap := ranAt[i].Sub(ranAt[i-1]); gap < delay {
			t.Fatalf("m1's run %d came %v after run %d, before its retry delay of %v", i+1, gap, i, delay)
		}
	}
	if m2 != 1 {
		t.Fatalf("m2 ran %d times; want once, after m1 was dead-lettered", m2)
	}
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
