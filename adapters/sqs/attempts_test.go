package sqs_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/sqs"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// processURL returns queueURL as seen by consumer process n: the same queue
// under another host name. The driver's bookkeeping was once shared by the
// drivers of one queue URL in a process; distinct URLs make each consumer of
// this test as separate as a process of its own.
func processURL(t *testing.T, queueURL string, n int) string {
	t.Helper()
	u, err := url.Parse(queueURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = fmt.Sprintf("p%d.invalid:%s", n, u.Port())
	return u.String()
}

// recordingDriver records the dead letters a subscriber decides on.
type recordingDriver struct {
	driver.Subscription
	onDead func(m *driver.Message, reason string, attempts int)
}

func (r *recordingDriver) DeadLetter(ctx context.Context, m *driver.Message, reason string, attempts int) error {
	r.onDead(m, reason, attempts)
	return r.Subscription.DeadLetter(ctx, m, reason, attempts)
}

// TestAttemptsAcrossProcesses runs several consumer processes on one
// Ordered queue, stopping one gracefully and starting a new one every few
// hundred milliseconds, with handler errors and MaxAttempts 2. Put-backs by
// one process (the chain behind a failed head, shutdown) must not count as
// attempts in another: every attempt a handler sees is a real run, a message
// is dead-lettered only after MaxAttempts runs, and no message of a key runs
// after one before it was dead-lettered unrun.
func TestAttemptsAcrossProcesses(t *testing.T) {
	client, _ := newClient(t)
	ctx := t.Context()
	opts := &sqs.Options{Ordering: policy.Ordered, Lease: 30 * time.Second, WaitTime: time.Second}
	q, err := sqs.CreateQueue(ctx, client, uniqueQueue("mp"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteQueues(client, q) })
	topic, err := sqs.OpenTopicDriver(ctx, client, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	const keys, perKey = 20, 10
	for k := range keys {
		var ms []*driver.Message
		for i := range perKey {
			id := fmt.Sprintf("k%02d-%02d", k, i)
			ms = append(ms, &driver.Message{ID: id, Key: fmt.Sprintf("k%02d", k), Payload: []byte(id)})
		}
		if err := topic.SendBatch(ctx, ms); err != nil {
			t.Fatal(err)
		}
	}

	var mu sync.Mutex
	runs := map[string]int{}      // handler runs per message ID
	done := map[string]string{}   // "acked" or "dead"
	deadAt := map[string]int{}    // attempts reported with the dead letter
	handled := map[string][]int{} // per key, the indexes handled successfully
	var overcount []string        // deliveries whose Attempt exceeded the real runs
	finished := make(chan struct{})
	var finishOnce sync.Once
	settle := func(id, how string) {
		if _, ok := done[id]; !ok {
			done[id] = how
		}
		if len(done) == keys*perKey {
			finishOnce.Do(func() { close(finished) })
		}
	}
	handler := func(_ context.Context, d *keyorder.Delivery) error {
		id := d.Message.ID
		mu.Lock()
		runs[id]++
		n := runs[id]
		if d.Attempt != n {
			overcount = append(overcount, fmt.Sprintf("%s: attempt %d at run %d", id, d.Attempt, n))
		}
		mu.Unlock()
		// A deterministic quarter of the runs fail (one message in 16 fails
		// twice and is dead-lettered after its two runs).
		if sum := sha256.Sum256(fmt.Appendf(nil, "%s/%d", id, n)); sum[0]%4 == 0 {
			return fmt.Errorf("run %d of %s fails", n, id)
		}
		var k, i int
		fmt.Sscanf(id, "k%d-%d", &k, &i)
		mu.Lock()
		handled[d.Message.Key] = append(handled[d.Message.Key], i)
		settle(id, "acked")
		mu.Unlock()
		return nil
	}
	onDead := func(m *driver.Message, reason string, attempts int) {
		mu.Lock()
		defer mu.Unlock()
		deadAt[m.ID] = attempts
		settle(m.ID, "dead")
	}

	type proc struct {
		sub  *subscribe.Subscriber
		done chan error
	}
	next := 0
	start := func() *proc {
		next++
		drv, err := sqs.OpenSubscriptionDriver(ctx, client, processURL(t, q, next), opts)
		if err != nil {
			t.Fatal(err)
		}
		s, err := subscribe.New(&recordingDriver{Subscription: drv, onDead: onDead}, &subscribe.Config{
			Workers: 4,
			Retry:   policy.Retry{MaxAttempts: 2, MinBackoff: 100 * time.Millisecond, MaxBackoff: 200 * time.Millisecond},
		})
		if err != nil {
			t.Fatal(err)
		}
		p := &proc{sub: s, done: make(chan error, 1)}
		go func() { p.done <- s.Run(context.WithoutCancel(ctx), handler) }()
		return p
	}
	stop := func(p *proc) {
		sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := p.sub.Close(sctx); err != nil {
			t.Errorf("close: %v", err)
		}
		// Close may come before the goroutine's Run has begun; Run then
		// returns ErrClosed at once, which is the documented outcome.
		if err := <-p.done; err != nil && !errors.Is(err, keyorder.ErrClosed) {
			t.Errorf("run: %v", err)
		}
	}
	procs := []*proc{start(), start(), start()}
	deadline := time.After(45 * time.Second)
	restarts := 0
loop:
	for i := 0; ; i++ {
		select {
		case <-finished:
			break loop
		case <-deadline:
			mu.Lock()
			t.Errorf("after 45s, %d of %d messages settled", len(done), keys*perKey)
			mu.Unlock()
			break loop
		case <-time.After(400 * time.Millisecond):
			// Stop one consumer gracefully and start another.
			stop(procs[i%len(procs)])
			procs[i%len(procs)] = start()
			restarts++
		}
	}
	for _, p := range procs {
		stop(p)
	}

	mu.Lock()
	defer mu.Unlock()
	dead := 0
	for id, attempts := range deadAt {
		dead++
		if runs[id] < attempts {
			t.Errorf("%s dead-lettered with %d attempts after %d handler runs", id, attempts, runs[id])
		}
	}
	for key, idx := range handled {
		for j := 1; j < len(idx); j++ {
			if idx[j] < idx[j-1] {
				t.Errorf("key %s handled out of order: %v", key, idx)
				break
			}
		}
		// No successor may run after a message of its key that was
		// dead-lettered without running.
		for _, i := range idx {
			for p := range i {
				pid := fmt.Sprintf("%s-%02d", key, p)
				if done[pid] == "dead" && runs[pid] == 0 {
					t.Errorf("%s-%02d handled after %s was dead-lettered unrun", key, i, pid)
				}
			}
		}
	}
	for _, o := range overcount {
		t.Errorf("attempt above the real handler runs: %s", o)
	}
	t.Logf("%d messages, %d handler runs, %d dead letters, %d graceful restarts, %d attempts above real runs",
		keys*perKey, sumRuns(runs), dead, restarts, len(overcount))
}

func sumRuns(runs map[string]int) int {
	n := 0
	for _, r := range runs {
		n += r
	}
	return n
}

// A consumer that dies holding a chain (its leases expire): on redelivery
// the lost lease counts for the message that may have been running, the
// chain's head, never for the members received behind it.
func TestLostLeaseCountsForTheHeadOnly(t *testing.T) {
	for _, oldest := range []bool{false, true} {
		t.Run(fmt.Sprintf("OldestFirst=%v", oldest), func(t *testing.T) {
			opts := &sqs.Options{Ordering: policy.Ordered, Lease: time.Second, WaitTime: time.Second, OldestFirst: oldest}
			client, q, topic, dead := openWith(t, opts)
			send(t, topic, "a1:A", "a2:A", "a3:A")
			_, names := receive(t, dead, 10, 5*time.Second)
			if want := []string{"a1@1", "a2@1", "a3@1"}; !slices.Equal(names, want) {
				t.Fatalf("received %v, want %v", names, want)
			}
			// The consumer dies; another one takes over after the lease.
			sub, err := sqs.OpenSubscriptionDriver(t.Context(), client, processURL(t, q, 2), opts)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for len(got) < 3 {
				ms, names := receive(t, sub, 10, 5*time.Second)
				if len(ms) == 0 {
					t.Fatalf("after the lease expired got only %v", got)
				}
				got = append(got, names...)
				if err := sub.Ack(t.Context(), ms); err != nil {
					t.Fatal(err)
				}
			}
			if want := []string{"a1@2", "a2@1", "a3@1"}; !slices.Equal(got, want) {
				t.Fatalf("after the lost lease got %v, want %v", got, want)
			}
		})
	}
}

// The bound on what a crash costs: a process that dies holding a chain
// (its leases expire) leaves one receive on each message of it; a message
// it had not started then reports one attempt more than its runs wherever
// it is next received as its group's head, and never more than one per
// crash. Received again behind its head it reports its runs exactly.
func TestCrashInflatesUnstartedByOnePerCrash(t *testing.T) {
	opts := &sqs.Options{Ordering: policy.Ordered, Lease: time.Second, WaitTime: time.Second}
	client, q, topic, p1 := openWith(t, opts)
	send(t, topic, "a1:A", "a2:A", "a3:A")
	ms, names := receive(t, p1, 10, 5*time.Second)
	if want := []string{"a1@1", "a2@1", "a3@1"}; !slices.Equal(names, want) {
		t.Fatalf("received %v, want the chain %v", names, want)
	}
	// a1 runs and is acknowledged; the process dies before a2 and a3
	// start.
	if err := p1.Ack(t.Context(), ms[:1]); err != nil {
		t.Fatal(err)
	}
	p2, err := sqs.OpenSubscriptionDriver(t.Context(), client, processURL(t, q, 2), opts)
	if err != nil {
		t.Fatal(err)
	}
	// After the lease: a2 as head carries the crash's receive (one above
	// its runs, the bound); a3, taken alone by the next process, too.
	var got []string
	for len(got) < 1 {
		ms, names = receive(t, p2, 1, 5*time.Second)
		got = append(got, names...)
	}
	if !slices.Equal(got, []string{"a2@2"}) {
		t.Fatalf("after the crash received %v, want a2@2", got)
	}
	if err := p2.Ack(t.Context(), ms); err != nil {
		t.Fatal(err)
	}
	ms, names = receive(t, p2, 1, 5*time.Second)
	if !slices.Equal(names, []string{"a3@2"}) {
		t.Fatalf("then received %v, want a3@2", names)
	}
	// p2 dies too, holding a3 unstarted: one more, not more.
	p3, err := sqs.OpenSubscriptionDriver(t.Context(), client, processURL(t, q, 3), opts)
	if err != nil {
		t.Fatal(err)
	}
	got = nil
	for len(got) < 1 {
		ms, names = receive(t, p3, 10, 5*time.Second)
		got = append(got, names...)
	}
	if !slices.Equal(got, []string{"a3@3"}) {
		t.Fatalf("after the second crash received %v, want a3@3", got)
	}
	if err := p3.Ack(t.Context(), ms); err != nil {
		t.Fatal(err)
	}
}

// callRecorder records the hand-backs (Release, Nack) of a subscriber.
type callRecorder struct {
	driver.Subscription
	mu       sync.Mutex
	released []string
	nacked   []string
}

func (r *callRecorder) Release(ctx context.Context, ms []*driver.Message) error {
	r.mu.Lock()
	for _, m := range ms {
		r.released = append(r.released, m.ID)
	}
	r.mu.Unlock()
	return r.Subscription.Release(ctx, ms)
}

func (r *callRecorder) Nack(ctx context.Context, m *driver.Message, delay time.Duration) error {
	r.mu.Lock()
	r.nacked = append(r.nacked, m.ID)
	r.mu.Unlock()
	return r.Subscription.Nack(ctx, m, delay)
}

// A chain whose member fails is held in process (Capabilities.HoldChains):
// the failed message is retried in process, the chain's later messages wait
// behind it leased, and nothing is put back unrun, so no process, this one
// or another consuming the queue, sees a receive that was not a run counted
// as an attempt (a4, the chain's last, is held too: see
// subscribe's holdsChain).
func TestFailedChainHeldInProcess(t *testing.T) {
	client, _ := newClient(t)
	ctx := t.Context()
	opts := &sqs.Options{Ordering: policy.Ordered, Lease: 30 * time.Second, WaitTime: time.Second}
	q, err := sqs.CreateQueue(ctx, client, uniqueQueue("hc"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteQueues(client, q) })
	topic, err := sqs.OpenTopicDriver(ctx, client, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	// a1 fails once, a2 twice; a4, the chain's last, fails once.
	fails := map[string]int{"a1": 1, "a2": 2, "a4": 1}
	send(t, topic, "a1:A", "a2:A", "a3:A", "a4:A")

	var mu sync.Mutex
	runs := map[string]int{}
	var order, wrong []string
	finished := make(chan struct{})
	handler := func(_ context.Context, d *keyorder.Delivery) error {
		name := string(d.Message.Payload)
		mu.Lock()
		defer mu.Unlock()
		runs[name]++
		order = append(order, fmt.Sprintf("%s@%d", name, d.Attempt))
		if d.Attempt != runs[name] {
			wrong = append(wrong, fmt.Sprintf("%s: attempt %d at run %d", name, d.Attempt, runs[name]))
		}
		if runs[name] <= fails[name] {
			return fmt.Errorf("run %d of %s fails", runs[name], name)
		}
		if name == "a4" {
			close(finished)
		}
		return nil
	}
	// Two consuming processes.
	var recs []*callRecorder
	var subs []*subscribe.Subscriber
	dones := make([]chan error, 2)
	for i := range 2 {
		drv, err := sqs.OpenSubscriptionDriver(ctx, client, processURL(t, q, i+1), opts)
		if err != nil {
			t.Fatal(err)
		}
		rec := &callRecorder{Subscription: drv}
		if !rec.Capabilities().HoldChains {
			t.Error("the Ordered driver does not declare HoldChains")
		}
		s, err := subscribe.New(rec, &subscribe.Config{
			Workers: 4,
			Retry:   policy.Retry{MaxAttempts: 5, MinBackoff: 100 * time.Millisecond, MaxBackoff: 200 * time.Millisecond},
		})
		if err != nil {
			t.Fatal(err)
		}
		recs, subs = append(recs, rec), append(subs, s)
		dones[i] = make(chan error, 1)
		go func() { dones[i] <- s.Run(context.WithoutCancel(ctx), handler) }()
	}
	select {
	case <-finished:
	case <-time.After(30 * time.Second):
		t.Error("a4 not acknowledged after 30s")
	}
	for i, s := range subs {
		sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		if err := s.Close(sctx); err != nil {
			t.Errorf("close: %v", err)
		}
		cancel()
		if err := <-dones[i]; err != nil && !errors.Is(err, keyorder.ErrClosed) {
			t.Errorf("run: %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"a1@1", "a1@2", "a2@1", "a2@2", "a2@3", "a3@1", "a4@1", "a4@2"}; !slices.Equal(order, want) {
		t.Errorf("runs %v, want %v", order, want)
	}
	for _, w := range wrong {
		t.Errorf("attempt above or below the real runs: %s", w)
	}
	for i, r := range recs {
		r.mu.Lock()
		if len(r.released) > 0 {
			t.Errorf("process %d put back unrun %v", i+1, r.released)
		}
		if len(r.nacked) > 0 {
			t.Errorf("process %d returned %v to SQS, received in a chain", i+1, r.nacked)
		}
		r.mu.Unlock()
	}
}
