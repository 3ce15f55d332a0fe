package pulsar_test

// This file: the run record (issue 28, items 2 and 3) at the driver level.
// A "process" is a driver over a client of its own; closing both without
// settling is what a killed process does to the broker (the connection
// goes, the broker redelivers, its redelivery count unchanged).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/pulsar"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// runsProcess opens a consumer of topicName's subscription "s" over a
// client of its own. crash closes the client only, as a killed process
// ends its connections; stop closes the driver first, as a graceful stop.
func runsProcess(t *testing.T, topicName string) (drv *pulsar.Subscription, crash, stop func()) {
	t.Helper()
	client := newClient(t)
	drv, err := pulsar.OpenSubscriptionDriver(context.Background(), client, topicName, "s", &pulsar.SubscriptionOptions{Ordering: policy.Ordered})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { drv.Close() })
	return drv, client.Close, func() { drv.Close(); client.Close() }
}

// receiveOne receives the next message within 30 s.
func receiveOne(t *testing.T, drv *pulsar.Subscription) *driver.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ms, err := drv.Receive(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	return ms[0]
}

// publishOne publishes one message of key "k" and returns its ID.
func publishOne(t *testing.T, topicName, payload string) string {
	t.Helper()
	ctx := context.Background()
	pub := newPublisher(ctx, t, topicName)
	id, err := pub.Publish(ctx, &keyorder.Message{Key: "k", Payload: []byte(payload)})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestRunsCrashLoopIsCounted: a message whose handler runs long enough to
// be recorded (runRecordDelay) and whose process then dies comes back as
// the next attempt, three processes in a row: attempts 1, 2, 3. Without
// the run record every delivery was attempt 1 (the broker does not count
// a consumer that dies).
func TestRunsCrashLoopIsCounted(t *testing.T) {
	topicName := uniqueTopic("runs-loop")
	drv, crash, _ := runsProcess(t, topicName)
	id := publishOne(t, topicName, "slow")
	for want := 1; want <= 3; want++ {
		if want > 1 {
			drv, crash, _ = runsProcess(t, topicName)
		}
		m := receiveOne(t, drv)
		if m.ID != id || m.Attempt != want {
			t.Fatalf("process %d: received %q attempt %d, want %q attempt %d", want, m.ID, m.Attempt, id, want)
		}
		if err := drv.Started(context.Background(), []*driver.Message{m}); err != nil {
			t.Fatal(err)
		}
		// The handler runs on until its start is recorded, then the
		// process dies.
		waitFor(t, 30*time.Second, "the run recorded", func() bool {
			n, ok, err := drv.RunRecord(context.Background(), m)
			if err != nil {
				t.Fatal(err)
			}
			return ok && n == want
		})
		crash()
	}
}

// TestRunsLazyStartCountsACrash: a handler that kills its process before
// its start is recorded is not counted once; its next delivery may have
// been running in a process that went away, so its start is recorded
// before it runs, and the delivery after the second crash is attempt 2.
// (The first process subscribed before the message was published, so it
// records lazily; the record delay is set to an hour so that the crash
// always comes first.) Without the run record: attempts 1, 1, 1.
func TestRunsLazyStartCountsACrash(t *testing.T) {
	pulsar.SetRunRecordDelay(t, time.Hour)
	topicName := uniqueTopic("runs-lazy")
	drv, crash, _ := runsProcess(t, topicName)
	id := publishOne(t, topicName, "fast")
	var attempts []int
	for p := range 3 {
		if p > 0 {
			drv, crash, _ = runsProcess(t, topicName)
		}
		m := receiveOne(t, drv)
		if m.ID != id {
			t.Fatalf("process %d received %q, want %q", p, m.ID, id)
		}
		attempts = append(attempts, m.Attempt)
		if err := drv.Started(context.Background(), []*driver.Message{m}); err != nil {
			t.Fatal(err)
		}
		crash() // at once
	}
	if attempts[0] != 1 || attempts[1] != 1 || attempts[2] != 2 {
		t.Fatalf("attempts %v, want [1 1 2]: one uncounted crash, then every run counted", attempts)
	}
}

// TestReturnCarriesAttemptsAndDelay: a message given back with Return
// (a graceful stop while it waits for its retry) comes back to the next
// process with its attempts and its retry time; once acknowledged, its
// record is gone. Release, as before Return existed, carried neither.
func TestReturnCarriesAttemptsAndDelay(t *testing.T) {
	topicName := uniqueTopic("runs-return")
	drv, _, stop := runsProcess(t, topicName)
	id := publishOne(t, topicName, "retry-later")
	m := receiveOne(t, drv)
	if err := drv.Started(context.Background(), []*driver.Message{m}); err != nil {
		t.Fatal(err)
	}
	due := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	if err := drv.Return(context.Background(), []driver.Returned{{Message: m, Attempts: 2, NotBefore: due}}); err != nil {
		t.Fatal(err)
	}
	stop()

	drv, _, stop = runsProcess(t, topicName)
	defer stop()
	m = receiveOne(t, drv)
	if m.ID != id || m.Attempt != 3 || !m.NotBefore.Equal(due) {
		t.Fatalf("after Return: %q attempt %d not before %v, want %q attempt 3 not before %v", m.ID, m.Attempt, m.NotBefore, id, due)
	}
	if err := drv.Ack(context.Background(), []*driver.Message{m}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the record cleared", func() bool {
		_, ok, err := drv.RunRecord(context.Background(), m)
		if err != nil {
			t.Fatal(err)
		}
		return !ok
	})
}

// TestGracefulRestartsKeepAttemptsAndDelay: a message that fails every run
// with a 1.5 s retry delay, its process stopped gracefully each time while
// the message waits for its retry. The subscriber gives it back with
// Return, and the next process runs it at the next attempt, not before the
// retry time: attempts 1, 2, 3, then dead-lettered under MaxAttempts 3,
// and the key's next message runs after. Without Return (Release) it ran
// as attempt 1 after every restart, at once.
func TestGracefulRestartsKeepAttemptsAndDelay(t *testing.T) {
	topicName := uniqueTopic("runs-graceful")
	ctx := context.Background()
	_, _, stop := runsProcess(t, topicName) // creates the subscription
	stop()
	pub := newPublisher(ctx, t, topicName)
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
		drv, _, stop := runsProcess(t, topicName)
		sub, err := subscribe.New(drv, &subscribe.Config{
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
		stop()
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

// TestChargedRunsAlone: a message that was running when its process died
// (its start recorded) comes back charged with that run, and is handed out
// alone: nothing else is handed out while it is in flight, and it is
// handed out only when nothing else is. Otherwise a message that kills
// every process it runs in charges the messages running beside it with
// each crash, and they are dead-lettered unrun: TestPoisonKillingItsProcessIsDeadLettered
// failed so in 1 of 12 runs before (k1/7, never run, dead-lettered with
// "attempts exhausted (3) by lost leases" after three crashes beside the
// poison message).
func TestChargedRunsAlone(t *testing.T) {
	topicName := uniqueTopic("runs-alone")
	drv, crash, _ := runsProcess(t, topicName)
	ctx := context.Background()
	pub := newPublisher(ctx, t, topicName)
	var ids []string
	for _, k := range []string{"a", "b", "c"} {
		id, err := pub.Publish(ctx, &keyorder.Message{Key: k, Payload: []byte(k)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	// Process 1 starts a and b, records both, and dies; c never started.
	var got []*driver.Message
	for len(got) < 3 {
		got = append(got, receiveOne(t, drv))
	}
	for i, m := range got {
		if m.ID != ids[i] {
			t.Fatalf("process 1 received %q as message %d, want %q (a, b, c in publish order)", m.ID, i, ids[i])
		}
	}
	if err := drv.Started(ctx, got[:2]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "both runs recorded", func() bool {
		for _, m := range got[:2] {
			if n, ok, err := drv.RunRecord(ctx, m); err != nil || !ok || n != 1 {
				return false
			}
		}
		return true
	})
	crash()

	drv, _, stop := runsProcess(t, topicName)
	defer stop()
	idle := func(what string) {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if ms, err := drv.Receive(rctx, 10); err == nil {
			var names []string
			for _, m := range ms {
				names = append(names, fmt.Sprintf("%s@%d", m.Payload, m.Attempt))
			}
			t.Fatalf("%s: Receive handed out %v", what, names)
		}
	}
	var order []string
	for len(order) < 3 {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		ms, err := drv.Receive(rctx, 10)
		cancel()
		if err != nil {
			t.Fatalf("after %v: %v", order, err)
		}
		for _, m := range ms {
			order = append(order, fmt.Sprintf("%s@%d", m.Payload, m.Attempt))
		}
		if len(ms) > 1 && ms[0].Attempt > 1 {
			t.Fatalf("a charged message was handed out with others: %v", order)
		}
		if ms[0].Attempt > 1 {
			idle("while " + string(ms[0].Payload) + " runs alone")
		}
		if err := drv.Ack(ctx, ms); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(order, []string{"a@2", "b@2", "c@1"}) {
		t.Fatalf("handed out %v, want [a@2 b@2 c@1]: each charged message alone, in order", order)
	}
}
