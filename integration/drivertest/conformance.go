package drivertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/keyordertest"
	"github.com/keyorder/keyorder/lanes"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// A case is one rule of the guarantee.
type testCase struct {
	name string
	spec Spec
	run  func(f *fixture)
}

// Cases lists the names of the suite's cases, for harnesses declaring
// Unsupported entries.
func Cases() []string {
	var out []string
	for _, c := range cases {
		out = append(out, c.name)
	}
	return out
}

var cases = []testCase{
	{"WorkedExample", Spec{Ordering: policy.Ordered}, workedExample},
	{"LedgerOrderedRetry", Spec{Ordering: policy.Ordered}, ledgerRetry},
	{"LedgerOrderedDeadLetter", Spec{Ordering: policy.Ordered}, ledgerDeadLetter},
	{"RetryAfterHoldsOnlyItsGroup", Spec{Ordering: policy.Ordered}, retryAfterHoldsOnlyItsGroup},
	{"PublishDelayHoldsGroup", Spec{Ordering: policy.Ordered}, publishDelayHoldsGroup},
	{"HeldGroupWithBacklogHoldsOnlyItself", Spec{Ordering: policy.Ordered}, heldGroupWithBacklog},
	{"DeadLetterThenGroupContinues", Spec{Ordering: policy.Ordered}, deadLetterThenContinue},
	{"RedriveOrder", Spec{Ordering: policy.Ordered}, redriveOrder},
	{"RedriveAfterDeadLetterErrorRuns", Spec{Ordering: policy.Ordered}, redriveAfterDeadLetterError},
	{"RedriveOfNotDeadLettersSaysSo", Spec{Ordering: policy.Ordered}, redriveNotDeadLetters},
	{"MissingKeyRejectVsUnordered", Spec{Ordering: policy.Ordered}, missingKey},
	{"ExclusiveAllowsOvertaking", Spec{Ordering: policy.Exclusive}, exclusiveOvertakes},
	{"ParallelRunsKeyConcurrently", Spec{Ordering: policy.Parallel}, parallelConcurrent},
	{"LostConsumerRedeliversFirst", Spec{Ordering: policy.Ordered, LeaseDuration: 10 * time.Second}, lostConsumer},
	{"CrashHoldingChainCountsOnlyHead", Spec{Ordering: policy.Ordered, LeaseDuration: 10 * time.Second}, crashHoldingChain},
	{"PanicCountsAsFailedAttempt", Spec{Ordering: policy.Ordered}, panicHoldsKey},
	{"PublishFailurePausesKey", Spec{Ordering: policy.Ordered}, publishFailurePausesKey},
	{"AsyncPublishKeepsOrder", Spec{Ordering: policy.Ordered}, asyncPublishKeepsOrder},
	{"BadInput", Spec{Ordering: policy.Ordered}, badInput},
	{"ExactBytesAndKnowableLimits", Spec{Ordering: policy.Ordered}, exactBytesAndKnowableLimits},
	{"PropertyOrderedUnderFailures", Spec{Ordering: policy.Ordered}, propertyOrdered},
	{"PropertyExclusiveUnderFailures", Spec{Ordering: policy.Exclusive}, propertyExclusive},
	{"ShutdownMidStreamLosesNothing", Spec{Ordering: policy.Ordered}, shutdownMidStream},
	{"ShutdownWhileGroupHeldLosesNothing", Spec{Ordering: policy.Ordered}, shutdownWhileHeld},
	// Ordered batches (conformance_batch.go).
	{"BatchFailsAtIndex", Spec{Ordering: policy.Ordered}, batchFailsAtIndex},
	{"BatchMaxWait", Spec{Ordering: policy.Ordered}, batchMaxWait},
	{"BatchRetryAfter", Spec{Ordering: policy.Ordered}, batchRetryAfter},
	{"BatchDeadLetter", Spec{Ordering: policy.Ordered}, batchDeadLetter},
	{"BatchShutdownLosesNothing", Spec{Ordering: policy.Ordered}, batchShutdown},
	{"BatchPropertyOrderedUnderFailures", Spec{Ordering: policy.Ordered}, batchProperty},
	// Throttling and composite keys: conformance_fair.go.
	{"ThrottledKeyHoldsOnlyItself", Spec{Ordering: policy.Ordered}, throttledKeyHoldsOnlyItself},
	{"ThrottledMessageHoldsNothingExclusive", Spec{Ordering: policy.Exclusive}, throttledMessageHoldsNothing},
	{"ThrottledMessageHoldsNothingParallel", Spec{Ordering: policy.Parallel}, throttledMessageHoldsNothing},
	{"ThrottleRateRespected", Spec{Ordering: policy.Ordered}, throttleRateRespected},
	{"CompositeKey", Spec{Ordering: policy.Ordered}, compositeKey},
	// Compaction (PostgreSQL): compaction.go.
	{"CompactionDeliversNewest", Spec{Ordering: policy.Exclusive, Compaction: true}, compactionDeliversNewest},
}

// Run runs the conformance suite against h. Every case runs or is reported
// as skipped with the reason the harness declared.
func Run(t *testing.T, h Harness) {
	caps := h.Capabilities()
	if caps.Unit == 0 {
		caps.Unit = 250 * time.Millisecond
		if caps.FakeClock {
			caps.Unit = time.Second
		}
	}
	for name := range caps.Unsupported {
		if !slices.Contains(Cases(), name) {
			t.Errorf("harness declares unknown case %q unsupported", name)
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if why, ok := caps.Unsupported[c.name]; ok {
				t.Skipf("not supported by this backend: %s", why)
			}
			if c.spec.Compaction && !caps.Compaction {
				t.Fatalf("the harness neither offers compaction (Capabilities.Compaction) nor declares %s Unsupported with its reason", c.name)
			}
			body := func(t *testing.T) { c.run(newFixture(t, h, caps, c.spec)) }
			if caps.FakeClock {
				synctest.Test(t, body)
			} else {
				body(t)
			}
		})
	}
}

// workedExample is DESIGN.md's worked example: Ordered, keyless messages
// unordered, two workers, each one message at a time.
func workedExample(f *fixture) {
	p := f.publisher(&publish.Config{MissingKey: policy.Unordered})
	f.publish(p, "a1:A", "a2:A", "s1:", "b1:B", "s2:", "a3:A", "b2:B")
	drv := f.consumer()
	// A broker that holds groups natively hands a message over only when a
	// worker is free (otherwise the process would have prefetched s2 before
	// the broker released a2); one that streams needs the whole backlog in
	// process to choose the oldest deliverable.
	out := 2
	if !drv.Capabilities().NativeHold {
		out = 16
	}
	g := newGate()
	f.subscribeOn(drv, &subscribe.Config{Workers: 2, Assign: lanes.Shared, MaxOutstanding: out}, g.handler)
	fail := keyorder.RetryAfter(errors.New("balance service down"), 5*f.unit)

	if f.caps.FakeClock {
		step := func(tm int, want ...string) {
			f.t.Helper()
			synctest.Wait()
			slices.Sort(want)
			if got := f.rec.runningNow(); !slices.Equal(got, want) {
				f.t.Fatalf("t=%d: running %v, want %v\n%s", tm, got, want, f.rec.dump())
			}
		}
		step(0, "a1", "s1")
		g.release(f.t, "s1", nil)
		step(1, "a1", "b1")
		time.Sleep(f.unit)
		g.release(f.t, "a1", nil)
		step(2, "a2", "b1")
		time.Sleep(f.unit)
		g.release(f.t, "b1", nil)
		step(3, "a2", "s2")
		time.Sleep(f.unit)
		g.release(f.t, "a2", fail) // t=4
		step(4, "b2", "s2")
		time.Sleep(f.unit)
		g.release(f.t, "s2", nil)
		step(5, "b2")
		time.Sleep(f.unit)
		g.release(f.t, "b2", nil)
		step(6)
		time.Sleep(2 * f.unit)
		step(8)
		time.Sleep(f.unit)
		step(9, "a2")
		time.Sleep(f.unit)
		g.release(f.t, "a2", nil)
		step(10, "a3")
		g.release(f.t, "a3", nil)
		synctest.Wait()
	} else {
		for _, n := range []string{"s1", "a1", "b1"} {
			g.release(f.t, n, nil)
		}
		// Which of a2 and b2 reaches the process first is the broker's
		// timing (pstest hands out each key's oldest unacknowledged
		// message, so an ack of b1 landing before a1's can bring b2 first;
		// then s2 and b2 fill both workers and a2 waits for one). So s2 and
		// b2 are released as soon as they run, whatever the order, and the
		// schedule's point is checked afterwards from the record: a2's wait
		// held only group A.
		others := make(chan error, 2)
		for _, n := range []string{"s2", "b2"} {
			go func() { others <- g.tryRelease(n, nil, time.Minute) }()
		}
		g.release(f.t, "a2", fail)
		failedAt := time.Now()
		for range 2 {
			if err := <-others; err != nil {
				f.t.Fatalf("%v\n%s", err, f.rec.dump())
			}
		}
		g.release(f.t, "a2", nil)
		if waited := time.Since(failedAt); waited < 5*f.unit-f.unit/5 {
			f.t.Errorf("a2 retried after %v, before its RetryAfter of %v", waited, 5*f.unit)
		}
		retry, _ := f.rec.firstEvent(func(e event) bool { return e.start && e.name == "a2" && e.attempt == 2 })
		for _, n := range []string{"s2", "b2"} {
			done, ok := f.rec.firstEvent(func(e event) bool { return !e.start && e.name == n && e.err == nil })
			if !ok || done.at.After(retry.at) {
				f.t.Errorf("%s was not handled before a2's retry: a2's wait held more than group A\n%s", n, f.rec.dump())
			}
		}
		g.release(f.t, "a3", nil)
	}
	f.waitFor(20, "a3 handled", func() bool { return slices.Contains(f.rec.succeeded("A"), "a3") })
	if got, want := f.rec.starts("A"), []string{"a1", "a2", "a2", "a3"}; !slices.Equal(got, want) {
		f.t.Errorf("group A handled %v, want %v", got, want)
	}
	if got, want := f.rec.starts("B"), []string{"b1", "b2"}; !slices.Equal(got, want) {
		f.t.Errorf("group B handled %v, want %v", got, want)
	}
}

// failOnce returns a handler that fails the first delivery of the message
// named name with err and acknowledges everything else.
func failOnce(name string, err error) subscribe.HandlerFunc {
	var once sync.Once
	return func(ctx context.Context, d *keyorder.Delivery) error {
		var res error
		if nameOf(d) == name {
			once.Do(func() { res = err })
		}
		return res
	}
}

// ledger publishes 101..104 for acct-42.
func ledger(f *fixture) {
	p := f.publisher(nil)
	f.publish(p, "101:acct-42", "102:acct-42", "103:acct-42", "104:acct-42")
}

func ledgerRetry(f *fixture) {
	ledger(f)
	f.subscribe(&subscribe.Config{Workers: 4}, failOnce("101", errors.New("balance service timed out")))
	f.waitFor(40, "104 applied", func() bool { return slices.Contains(f.rec.succeeded("acct-42"), "104") })
	if got, want := f.rec.starts("acct-42"), []string{"101", "101", "102", "103", "104"}; !slices.Equal(got, want) {
		f.t.Fatalf("acct-42 handled %v, want %v (102-104 must wait for 101's retry)", got, want)
	}
}

func ledgerDeadLetter(f *fixture) {
	ledger(f)
	r := f.subscribe(&subscribe.Config{Workers: 4}, func(ctx context.Context, d *keyorder.Delivery) error {
		if nameOf(d) == "101" {
			return keyorder.Permanent(errors.New("account closed"))
		}
		return nil
	})
	f.waitFor(40, "104 applied", func() bool { return slices.Contains(f.rec.succeeded("acct-42"), "104") })
	if got, want := f.rec.starts("acct-42"), []string{"101", "102", "103", "104"}; !slices.Equal(got, want) {
		f.t.Fatalf("acct-42 handled %v, want %v", got, want)
	}
	f.wantOneDeadLetter(r.sub, "101", "account closed")
}

func retryAfterHoldsOnlyItsGroup(f *fixture) {
	p := f.publisher(nil)
	f.publish(p, "a1:A", "a2:A")
	f.subscribe(&subscribe.Config{Workers: 4}, failOnce("a1", keyorder.RetryAfter(errors.New("later"), 6*f.unit)))
	f.waitFor(20, "a1 failed", func() bool { return len(f.rec.starts("A")) == 1 && len(f.rec.runningNow()) == 0 })
	failedAt := time.Now()
	f.publish(p, "b1:B", "b2:B")
	f.waitFor(20, "group B handled", func() bool { return len(f.rec.succeeded("B")) == 2 })
	if time.Since(failedAt) >= 6*f.unit {
		f.t.Fatalf("group B waited for A's retry delay")
	}
	if got := f.rec.starts("A"); !slices.Equal(got, []string{"a1"}) {
		f.t.Fatalf("group A ran %v during a1's RetryAfter", got)
	}
	f.waitFor(40, "a2 handled", func() bool { return slices.Contains(f.rec.succeeded("A"), "a2") })
	if got, want := f.rec.starts("A"), []string{"a1", "a1", "a2"}; !slices.Equal(got, want) {
		f.t.Fatalf("group A handled %v, want %v", got, want)
	}
	retry, _ := f.rec.firstEvent(func(e event) bool { return e.start && e.name == "a1" && e.attempt == 2 })
	if retry.at.Sub(failedAt) < 6*f.unit-f.unit/5 {
		f.t.Fatalf("a1 retried %v after failing, before its RetryAfter of %v", retry.at.Sub(failedAt), 6*f.unit)
	}
}

func publishDelayHoldsGroup(f *fixture) {
	p := f.publisher(nil)
	start := time.Now()
	delay := 5 * f.unit
	if _, err := p.Publish(f.ctx, &keyorder.Message{Key: "A", Payload: []byte("a1"), NotBefore: start.Add(delay)}); err != nil {
		f.t.Fatal(err)
	}
	f.publish(p, "a2:A", "b1:B")
	f.subscribe(&subscribe.Config{Workers: 4}, nil)
	f.waitFor(20, "a2 handled", func() bool { return len(f.rec.succeeded("A")) == 2 })
	if got := f.rec.starts("*"); !slices.Equal(got, []string{"b1", "a1", "a2"}) {
		f.t.Fatalf("handled %v, want b1 first, then a1 at its not-before time, then a2", got)
	}
	a1, _ := f.rec.firstEvent(func(e event) bool { return e.start && e.name == "a1" })
	if a1.at.Before(start.Add(delay)) {
		f.t.Fatalf("a1 ran %v after publish, before its delay %v", a1.at.Sub(start), delay)
	}
}

// heldGroupWithBacklog: a group held by a retry delay, or by a publish
// delay, with many messages behind it holds only itself, however few
// workers and however small the flow-control budget. (Where the process
// holds groups, the broker streams the backlog in; it must not fill the
// budget other groups need.)
func heldGroupWithBacklog(f *fixture) {
	const backlog = 12
	hold := 20 * f.unit
	p := f.publisher(nil)
	f.publish(p, "a01:A")
	if _, err := p.Publish(f.ctx, &keyorder.Message{Key: "D", Payload: []byte("d01"), NotBefore: time.Now().Add(hold)}); err != nil {
		f.t.Fatal(err)
	}
	var a, d []string
	for i := 2; i <= backlog; i++ {
		a = append(a, fmt.Sprintf("a%02d:A", i))
		d = append(d, fmt.Sprintf("d%02d:D", i))
	}
	f.publish(p, a...)
	f.publish(p, d...)
	f.subscribe(&subscribe.Config{Workers: 2}, failOnce("a01", keyorder.RetryAfter(errors.New("later"), hold)))
	f.waitFor(20, "a01 failed", func() bool { return len(f.rec.starts("A")) == 1 && len(f.rec.runningNow()) == 0 })
	begin := time.Now()
	f.publish(p, "b1:B", "b2:B", "b3:B")
	f.waitFor(10, "group B handled while A and D are held", func() bool { return len(f.rec.succeeded("B")) == 3 })
	if waited := time.Since(begin); waited >= hold/2 {
		f.t.Fatalf("group B took %v, waiting on the held groups", waited)
	}
	if got := f.rec.starts("A"); !slices.Equal(got, []string{"a01"}) {
		f.t.Fatalf("group A ran %v during a01's retry delay", got)
	}
	if got := f.rec.starts("D"); len(got) != 0 {
		f.t.Fatalf("group D ran %v before d01's not-before time", got)
	}
	f.waitFor(60, "both backlogs handled", func() bool {
		return len(f.rec.succeeded("A")) == backlog && len(f.rec.succeeded("D")) == backlog
	})
	for _, key := range []string{"A", "D"} {
		var want []string
		if key == "A" {
			want = append(want, "a01")
		}
		for i := 1; i <= backlog; i++ {
			want = append(want, fmt.Sprintf("%s%02d", strings.ToLower(key), i))
		}
		if got := f.rec.starts(key); !slices.Equal(got, want) {
			f.t.Fatalf("group %s handled %v, want %v", key, got, want)
		}
	}
}

func deadLetterThenContinue(f *fixture) {
	p := f.publisher(nil)
	f.publish(p, "a1:A", "a2:A")
	r := f.subscribe(&subscribe.Config{Workers: 2, Retry: policy.Retry{MaxAttempts: 3}}, func(ctx context.Context, d *keyorder.Delivery) error {
		if nameOf(d) == "a1" {
			return fmt.Errorf("attempt %d failed", d.Attempt)
		}
		return nil
	})
	f.waitFor(40, "a2 handled", func() bool { return slices.Contains(f.rec.succeeded("A"), "a2") })
	if got, want := f.rec.starts("A"), []string{"a1", "a1", "a1", "a2"}; !slices.Equal(got, want) {
		f.t.Fatalf("group A handled %v, want %v", got, want)
	}
	dl, err := r.sub.DeadLetters(f.ctx, 10)
	if errors.Is(err, keyorder.ErrUnsupported) {
		f.t.Skipf("group order checked; listing dead letters is not supported by this backend (%v)", err)
	}
	if err != nil || len(dl) != 1 || dl[0].Attempts != 3 || !strings.Contains(dl[0].Reason, "attempt 3 failed") {
		f.t.Fatalf("dead letters = %+v, %v; want a1 with 3 attempts and the last error", dl, err)
	}
	// A limit of 0 lists them all (driver.DeadLetterStore), on every backend.
	if all, err := r.sub.DeadLetters(f.ctx, 0); err != nil || len(all) != 1 || all[0].Message.ID != dl[0].Message.ID {
		f.t.Fatalf("DeadLetters(ctx, 0) = %+v, %v; want every dead letter (a1)", all, err)
	}
}

func redriveOrder(f *fixture) {
	p := f.publisher(nil)
	f.publish(p, "a1:A", "a2:A")
	var redriven sync.Once
	r := f.subscribe(&subscribe.Config{Workers: 2}, func(ctx context.Context, d *keyorder.Delivery) error {
		if nameOf(d) == "a1" && d.Attempt == 1 && !slices.Contains(f.rec.succeeded("A"), "a3") {
			var err error = keyorder.Permanent(errors.New("bad"))
			return err
		}
		return nil
	})
	f.waitFor(20, "a2 handled", func() bool { return slices.Contains(f.rec.succeeded("A"), "a2") })
	f.publish(p, "a3:A")
	f.waitFor(20, "a3 handled", func() bool { return slices.Contains(f.rec.succeeded("A"), "a3") })
	dl, err := r.sub.DeadLetters(f.ctx, 10)
	if err != nil || len(dl) != 1 {
		f.t.Fatalf("dead letters = %+v, %v", dl, err)
	}
	redriven.Do(func() {
		n, err := r.sub.Redrive(f.ctx, []string{dl[0].Message.ID})
		if err != nil || n != 1 {
			f.t.Fatalf("Redrive = %d, %v", n, err)
		}
	})
	f.publish(p, "a4:A")
	f.waitFor(20, "a4 handled", func() bool { return slices.Contains(f.rec.succeeded("A"), "a4") })
	if got, want := f.rec.starts("A"), []string{"a1", "a2", "a3", "a1", "a4"}; !slices.Equal(got, want) {
		f.t.Fatalf("group A handled %v, want %v (redrive goes after what arrived meanwhile)", got, want)
	}
	if dl, _ := r.sub.DeadLetters(f.ctx, 10); len(dl) != 0 {
		f.t.Fatalf("dead letters after redrive = %+v", dl)
	}
}

func missingKey(f *fixture) {
	reject := f.publisher(nil)
	_, err := reject.Publish(f.ctx, &keyorder.Message{Payload: []byte("lost")})
	if !errors.Is(err, keyorder.ErrMissingKey) {
		f.t.Fatalf("keyless publish under Reject = %v, want ErrMissingKey", err)
	}
	unordered := f.publisher(&publish.Config{MissingKey: policy.Unordered})
	f.publish(unordered, "s1:", "k1:K")
	// The header is the second source of the key.
	if _, err := unordered.Publish(f.ctx, &keyorder.Message{Payload: []byte("k2"), Headers: map[string]string{keyorder.HeaderPartitionKey: "K"}}); err != nil {
		f.t.Fatal(err)
	}
	var mu sync.Mutex
	keys := map[string]string{}
	f.subscribe(nil, func(ctx context.Context, d *keyorder.Delivery) error {
		mu.Lock()
		_, inHeaders := d.Headers[keyorder.HeaderPartitionKey]
		keys[nameOf(d)] = d.Key + "|" + fmt.Sprint(inHeaders)
		mu.Unlock()
		return nil
	})
	f.waitFor(20, "three messages", func() bool { return len(f.rec.succeeded("*")) >= 3 })
	mu.Lock()
	defer mu.Unlock()
	// The key is a field of the delivery, never a header (the header
	// k2 was published with is where its key came from).
	want := map[string]string{"s1": "|false", "k1": "K|false", "k2": "K|false"}
	if fmt.Sprint(keys) != fmt.Sprint(want) {
		f.t.Fatalf("delivered keys %v, want %v (the rejected message must not arrive)", keys, want)
	}
}

func exclusiveOvertakes(f *fixture) {
	p := f.publisher(nil)
	f.publish(p, "101:acct", "102:acct")
	f.subscribe(&subscribe.Config{Workers: 2}, failOnce("101", keyorder.RetryAfter(errors.New("later"), 4*f.unit)))
	f.waitFor(30, "101 retried", func() bool { return slices.Contains(f.rec.succeeded("acct"), "101") })
	if got, want := f.rec.starts("acct"), []string{"101", "102", "101"}; !slices.Equal(got, want) {
		f.t.Fatalf("Exclusive handled %v, want %v (102 overtakes the waiting 101)", got, want)
	}
	if m := f.rec.maxInFlight("acct"); m != 1 {
		f.t.Fatalf("Exclusive had %d of one key in flight", m)
	}
}

func parallelConcurrent(f *fixture) {
	p := f.publisher(nil)
	f.publish(p, "k1:K", "k2:K", "k3:K")
	g := newGate()
	f.subscribe(&subscribe.Config{Workers: 3, Assign: lanes.Shared}, g.handler)
	f.waitFor(20, "three of key K in flight", func() bool { return len(f.rec.runningNow()) == 3 })
	for _, n := range []string{"k1", "k2", "k3"} {
		g.release(f.t, n, nil)
	}
	f.waitFor(20, "all handled", func() bool { return len(f.rec.succeeded("K")) == 3 })
}

func lostConsumer(f *fixture) {
	p := f.publisher(nil)
	f.publish(p, "a1:A", "a2:A")
	// A consumer takes a1, starts its handler and dies: it never settles
	// nor extends the lease.
	crashed := f.consumer()
	// The lease runs from when the broker handed a1 out, at the earliest
	// when the receive was sent: on a loaded machine the receive and the
	// start record can take seconds, and timing the lease from after them
	// flagged an SQS redelivery 7.5 s "into" a 10 s lease.
	takenAt := time.Now()
	ms, err := crashed.Receive(f.ctx, 1)
	if err != nil || len(ms) != 1 || string(ms[0].Payload) != "a1" {
		f.t.Fatalf("crashed consumer received %v, %v", ms, err)
	}
	f.started(crashed, ms)
	lease := crashed.Capabilities().LeaseDuration
	f.subscribe(&subscribe.Config{Workers: 2}, nil)
	f.waitFor(int(4*lease/f.unit)+40, "a2 handled", func() bool { return slices.Contains(f.rec.succeeded("A"), "a2") })
	if got := f.rec.starts("A"); !slices.Equal(got, []string{"a1", "a2"}) {
		f.t.Fatalf("after a lost consumer, group A handled %v, want a1 (redelivered) before a2", got)
	}
	e, _ := f.rec.firstEvent(func(e event) bool { return e.start && e.name == "a1" })
	if e.attempt < 2 {
		f.t.Errorf("redelivered a1 has attempt %d: the lost lease must count as an attempt", e.attempt)
	}
	if lease > 0 && e.at.Sub(takenAt) < lease-f.unit/5 {
		f.t.Errorf("a1 redelivered %v after it was taken, before its lease of %v expired", e.at.Sub(takenAt), lease)
	}
	crashed.Close()
}

// started tells a driver that counts only started messages that the
// handlers of ms start, as subscribe would tell it before running them.
func (f *fixture) started(d driver.Subscription, ms []*driver.Message) {
	f.t.Helper()
	if r, ok := d.(driver.StartRecorder); ok {
		if err := r.Started(f.ctx, ms); err != nil {
			f.t.Fatalf("Started: %v", err)
		}
	}
}

// crashHoldingChain: a consumer receives as much of a key's messages as the
// backend hands out together (a chain, a1 a2 a3, where it returns one), its
// process starts a1 and dies without settling anything, so its leases
// expire. Only a1 may have been running (under Ordered nothing behind it
// runs before it is done), so only a1 comes back with an attempt counted;
// a2 and a3 never ran and come back at attempt 1 (driver.Message.Attempt).
// Counted for every member, a few crashes would dead-letter messages that
// never ran.
func crashHoldingChain(f *fixture) {
	p := f.publisher(nil)
	f.publish(p, "a1:A", "a2:A", "a3:A")
	crashed := f.consumer()
	var held []string
	var first *driver.Message
	copies := map[string]any{} // driver.Message.Copy of what the crashed consumer held
	for len(held) < 3 {
		// What arrives within a short wait after the first receive is
		// part of the same hand-out (a streaming backend delivers a key's
		// messages one by one).
		ctx, cancel := f.ctx, context.CancelFunc(func() {})
		if len(held) > 0 {
			ctx, cancel = context.WithTimeout(f.ctx, 2*f.unit)
		}
		ms, err := crashed.Receive(ctx, 3-len(held))
		cancel()
		if err != nil && len(held) > 0 {
			break
		}
		if err != nil || len(ms) == 0 {
			f.t.Fatalf("crashed consumer received %v, %v", ms, err)
		}
		for _, m := range ms {
			if first == nil {
				first = m
			}
			held = append(held, string(m.Payload))
			copies[string(m.Payload)] = m.Copy
		}
	}
	f.started(crashed, []*driver.Message{first}) // its process starts a1
	if !slices.Equal(held, []string{"a1", "a2", "a3"}[:len(held)]) {
		f.t.Fatalf("crashed consumer received %v, want a prefix of a1 a2 a3", held)
	}
	f.t.Logf("the crashed consumer held %v", held)
	lease := crashed.Capabilities().LeaseDuration
	next := &copyLog{Subscription: f.consumer()}
	f.subscribeOn(next, &subscribe.Config{Workers: 2}, nil)
	f.waitFor(int(4*lease/f.unit)+40, "a3 handled", func() bool { return slices.Contains(f.rec.succeeded("A"), "a3") })
	// The redeliveries are of the same copies (what tells them from a
	// redriven message; see RedriveAfterDeadLetterErrorRuns).
	for name, c := range copies {
		if again := next.first(name); c != nil && again != c {
			f.t.Errorf("%s redelivered with Copy %v, delivered to the crashed consumer with %v: "+
				"driver.Message.Copy must be equal on every delivery of one copy", name, again, c)
		}
	}
	if got := f.rec.starts("A"); !slices.Equal(got, []string{"a1", "a2", "a3"}) {
		f.t.Fatalf("after the crash group A handled %v, want a1 a2 a3", got)
	}
	for name, want := range map[string]int{"a1": 2, "a2": 1, "a3": 1} {
		e, _ := f.rec.firstEvent(func(e event) bool { return e.start && e.name == name })
		if e.attempt != want {
			f.t.Errorf("%s ran at attempt %d, want %d (held by the crashed consumer: %v; only a1 may have been running)\n%s",
				name, e.attempt, want, held, f.rec.dump())
		}
	}
	crashed.Close()
}

func panicHoldsKey(f *fixture) {
	p := f.publisher(nil)
	f.publish(p, "a1:A", "a2:A")
	var once sync.Once
	r := f.subscribe(&subscribe.Config{Workers: 2}, func(ctx context.Context, d *keyorder.Delivery) error {
		if nameOf(d) == "a1" {
			once.Do(func() { panic("nil account") })
		}
		return nil
	})
	f.waitFor(30, "a2 handled", func() bool { return slices.Contains(f.rec.succeeded("A"), "a2") })
	if got, want := f.rec.starts("A"), []string{"a1", "a1", "a2"}; !slices.Equal(got, want) {
		f.t.Fatalf("group A handled %v, want %v (the panic is a failed attempt and holds the key)", got, want)
	}
	if n := counts(r.sub).Panics; n != 1 {
		f.t.Fatalf("panics counted = %d, want 1", n)
	}
}

func publishFailurePausesKey(f *fixture) {
	ft := &failingTopic{Topic: f.pair.Topic}
	saved := f.pair.Topic
	f.pair.Topic = ft
	p := f.publisher(nil)
	auto := f.publisher(&publish.Config{AutoResume: true})
	f.pair.Topic = saved
	boom := errors.New("broker unavailable")
	ft.failKey("bad", boom)
	if _, err := p.Publish(f.ctx, &keyorder.Message{Key: "bad", Payload: []byte("x1")}); !errors.Is(err, boom) {
		f.t.Fatalf("failed publish = %v, want the broker error", err)
	}
	ft.setFail(nil)
	_, err := p.Publish(f.ctx, &keyorder.Message{Key: "bad", Payload: []byte("x2")})
	var kp *keyorder.KeyPausedError
	if !errors.Is(err, keyorder.ErrKeyPaused) || !errors.As(err, &kp) || kp.Key != "bad" || !errors.Is(err, boom) {
		f.t.Fatalf("publish of a paused key = %v, want ErrKeyPaused naming the key and the cause", err)
	}
	f.publish(p, "g1:good")
	if got := p.Paused(); !slices.Equal(got, []string{"bad"}) {
		f.t.Fatalf("Paused() = %v", got)
	}
	if !p.Resume("bad") || len(p.Paused()) != 0 {
		f.t.Fatal("Resume did not resume the key")
	}
	f.publish(p, "x3:bad")
	// Auto-resume: the failed publish returns its error, the next is sent.
	ft.failKey("auto", boom)
	if _, err := auto.Publish(f.ctx, &keyorder.Message{Key: "auto", Payload: []byte("y1")}); !errors.Is(err, boom) {
		f.t.Fatalf("auto-resume publish = %v", err)
	}
	ft.setFail(nil)
	f.publish(auto, "y2:auto")
	if len(auto.Paused()) != 0 {
		f.t.Fatalf("auto-resume publisher paused %v", auto.Paused())
	}
	f.subscribe(nil, nil)
	f.waitFor(20, "sent messages handled", func() bool { return len(f.rec.succeeded("*")) == 3 })
	got := f.rec.succeeded("*")
	slices.Sort(got)
	if !slices.Equal(got, []string{"g1", "x3", "y2"}) {
		f.t.Fatalf("handled %v, want exactly the messages that were sent", got)
	}
}

// asyncPublishKeepsOrder: one goroutine publishes with PublishAsync, not
// waiting for the broker, under outstanding limits small enough to block
// it; every key's messages are handled in the order they were published,
// each delivered with the ID its Result returned.
func asyncPublishKeepsOrder(f *fixture) {
	const nKeys, nMsgs = 20, 400
	p := f.publisher(&publish.Config{MaxOutstandingMessages: 64, MaxBatch: 10})
	order := map[string][]string{}
	var results []*publish.Result
	var names []string
	for i := range nMsgs {
		key := fmt.Sprintf("k%02d", (i*7+i/nKeys)%nKeys)
		name := fmt.Sprintf("m%03d", i)
		order[key] = append(order[key], name)
		names = append(names, name)
		m := &keyorder.Message{Key: key, Payload: []byte(name)}
		if i%2 == 0 {
			m.ID = f.t.Name() + "/" + name // chosen up front; the rest are assigned
		}
		results = append(results, p.PublishAsync(f.ctx, m))
	}
	ids := map[string]string{} // name -> the ID its Result returned
	for i, r := range results {
		id, err := r.Get(f.ctx)
		if err != nil {
			f.t.Fatalf("%s: %v", names[i], err)
		}
		if i%2 == 0 && id != f.t.Name()+"/"+names[i] {
			f.t.Errorf("%s: Result ID %q, want the one chosen", names[i], id)
		}
		ids[names[i]] = id
	}
	var mu sync.Mutex
	got := map[string]string{} // name -> delivered ID
	f.subscribe(&subscribe.Config{Workers: 4}, func(_ context.Context, d *keyorder.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		got[nameOf(d)] = d.ID
		return nil
	})
	f.waitFor(400, "every message handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= nMsgs
	})
	mu.Lock()
	defer mu.Unlock()
	for name, id := range ids {
		if got[name] != id {
			f.t.Errorf("%s delivered with ID %q, its Result returned %q", name, got[name], id)
		}
	}
	for key, want := range order {
		if m := f.rec.maxInFlight(key); m > 1 {
			f.t.Errorf("key %s: %d in flight at once", key, m)
		}
		var first []string
		for _, n := range f.rec.starts(key) {
			if !slices.Contains(first, n) {
				first = append(first, n)
			}
		}
		if !slices.Equal(first, want) {
			f.t.Errorf("key %s: handled in order %v, published %v", key, first, want)
		}
	}
}

func badInput(f *fixture) {
	p := f.publisher(nil)
	lim := p.Limits()
	check := func(what string, m *keyorder.Message, want error) {
		f.t.Helper()
		if _, err := p.Publish(f.ctx, m); !errors.Is(err, want) {
			f.t.Errorf("%s: Publish = %v, want %v", what, err, want)
		}
	}
	if lim.MaxKeyBytes > 0 {
		var le *keyorder.LimitError
		_, err := p.Publish(f.ctx, &keyorder.Message{Key: strings.Repeat("k", lim.MaxKeyBytes+1), Payload: []byte("x")})
		if !errors.As(err, &le) || le.Limit != "key length" || le.Max != lim.MaxKeyBytes || !errors.Is(err, keyorder.ErrInvalidMessage) {
			f.t.Errorf("key over %d bytes: %v", lim.MaxKeyBytes, err)
		}
	}
	if lim.KeyUTF8 {
		check("invalid UTF-8 key", &keyorder.Message{Key: "\xff\xfe", Payload: []byte("x")}, keyorder.ErrInvalidMessage)
	}
	if lim.MaxPayloadBytes > 0 {
		check("payload over the limit", &keyorder.Message{Key: "k", Payload: make([]byte, lim.MaxPayloadBytes+1)}, keyorder.ErrInvalidMessage)
	}
	if lim.PayloadRequired {
		check("empty payload", &keyorder.Message{Key: "k"}, keyorder.ErrInvalidMessage)
	}
	check("nil message", nil, keyorder.ErrInvalidMessage)
	// A batch with one bad message sends nothing.
	_, err := p.PublishBatch(f.ctx, []*keyorder.Message{{Key: "k", Payload: []byte("ok1")}, {Payload: []byte("no key")}})
	if !errors.Is(err, keyorder.ErrMissingKey) || !strings.Contains(err.Error(), "message 1") {
		f.t.Errorf("batch with a keyless message = %v", err)
	}
	f.publish(p, "ok2:k")
	f.subscribe(nil, nil)
	f.waitFor(20, "ok2 handled", func() bool { return len(f.rec.succeeded("*")) >= 1 })
	if got := f.rec.succeeded("*"); !slices.Equal(got, []string{"ok2"}) {
		f.t.Errorf("handled %v: a rejected message (or half a batch) was sent", got)
	}
	if err := p.Close(f.ctx); err != nil {
		f.t.Fatal(err)
	}
	check("publish after Close", &keyorder.Message{Key: "k", Payload: []byte("x")}, keyorder.ErrClosed)
	drv := f.consumer()
	if _, err := subscribe.New(drv, &subscribe.Config{Retry: policy.Retry{MaxAttempts: -1}}); !errors.Is(err, keyorder.ErrInvalidConfig) {
		f.t.Errorf("MaxAttempts -1: %v, want ErrInvalidConfig", err)
	}
	drv.Close()
}

// property publishes many messages over many keys with random failures and
// checks the guarantee from the handlers' records.
func property(f *fixture, ordering policy.Ordering) {
	seed := rand.Uint64()
	if s := os.Getenv("KEYORDER_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	f.t.Logf("seed %d (rerun with KEYORDER_SEED=%d)", seed, seed)
	defer func() {
		if f.t.Failed() {
			f.t.Logf("FAILED with seed %d", seed)
		}
	}()
	rng := rand.New(rand.NewPCG(seed, 1))
	const nKeys, nMsgs = 40, 400
	p := f.publisher(nil)
	var order = map[string][]string{}
	failPlan := map[string]int{} // name -> failures before success; 99 = permanent
	var batch []*keyorder.Message
	for i := range nMsgs {
		key := fmt.Sprintf("k%02d", rng.IntN(nKeys))
		name := fmt.Sprintf("m%03d", i)
		order[key] = append(order[key], name)
		switch r := rng.IntN(20); {
		case r == 0:
			failPlan[name] = 99
		case r < 4:
			failPlan[name] = 1 + rng.IntN(2)
		}
		batch = append(batch, &keyorder.Message{ID: f.t.Name() + "/" + name, Key: key, Payload: []byte(name)})
	}
	var mu sync.Mutex
	fails := map[string]int{}
	workers := 2 + rng.IntN(6)
	// The users' test kit checks the same history, so it is proven on
	// every backend too.
	kit := keyordertest.NewRecorder(nil)
	r := f.subscribe(&subscribe.Config{Workers: workers, Retry: policy.Retry{MaxAttempts: 4, MinBackoff: f.unit / 10, MaxBackoff: f.unit / 2},
		Middleware: []subscribe.Middleware{kit.Middleware()}},
		func(ctx context.Context, d *keyorder.Delivery) error {
			name := nameOf(d)
			mu.Lock()
			plan, n := failPlan[name], fails[name]
			if n < plan {
				fails[name]++
			}
			mu.Unlock()
			if plan == 99 {
				return keyorder.Permanent(errors.New("poison"))
			}
			if n < plan {
				if rng2 := len(name) % 2; rng2 == 0 {
					return keyorder.RetryAfter(errors.New("transient"), f.unit/5)
				}
				return errors.New("transient")
			}
			return nil
		})
	for i := 0; i < len(batch); i += 50 {
		if _, err := p.PublishBatch(f.ctx, batch[i:min(i+50, len(batch))]); err != nil {
			f.t.Fatal(err)
		}
		kit.Published(batch[i:min(i+50, len(batch))]...)
	}
	dead := 0
	for _, v := range failPlan {
		if v == 99 {
			dead++
		}
	}
	f.waitFor(400, "every message acked or dead-lettered", func() bool {
		return int(counts(r.sub).Acked+counts(r.sub).DeadLettered) >= nMsgs
	})
	r.stop(f.t)
	kit.SetMaxAttempts(r.sub.Retry().MaxAttempts)
	if rep := keyordertest.Check(f.t, kit, keyordertest.Spec{Ordering: ordering}); len(rep.Duplicates) > 0 {
		f.t.Logf("keyordertest: %d messages handled again after they were resolved (at least once)", len(rep.Duplicates))
	}
	if got := int(counts(r.sub).DeadLettered); got != dead {
		f.t.Errorf("dead-lettered %d, want %d", got, dead)
	}
	okCount := map[string]int{}
	for _, n := range f.rec.succeeded("*") {
		okCount[n]++
	}
	for key, names := range order {
		if m := f.rec.maxInFlight(key); m > 1 {
			f.t.Errorf("key %s: %d in flight at once", key, m)
		}
		for _, n := range names {
			if (failPlan[n] == 99) == (okCount[n] > 0) {
				f.t.Errorf("%s: succeeded %d times, planned permanent failure %v", n, okCount[n], failPlan[n] == 99)
			}
		}
		if ordering != policy.Ordered {
			continue
		}
		var first []string
		for _, n := range f.rec.starts(key) {
			if !slices.Contains(first, n) {
				first = append(first, n)
			}
		}
		if !slices.Equal(first, names) {
			f.t.Errorf("key %s: first handled in order %v, published %v", key, first, names)
		}
		// Ordered: a message's successors start only after it succeeded
		// or was dead-lettered.
		starts := f.rec.starts(key)
		for i, n := range names[:len(names)-1] {
			last := slices.Index(starts, names[i+1])
			if li := lastIndex(starts, n); li > last {
				f.t.Errorf("key %s: %s ran again after %s started", key, n, names[i+1])
			}
		}
	}
}

func lastIndex(s []string, v string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == v {
			return i
		}
	}
	return -1
}

func propertyOrdered(f *fixture)   { property(f, policy.Ordered) }
func propertyExclusive(f *fixture) { property(f, policy.Exclusive) }

func shutdownMidStream(f *fixture) {
	p := f.publisher(nil)
	const n = 120
	var msgs []*keyorder.Message
	order := map[string][]string{}
	for i := range n {
		key := fmt.Sprintf("k%d", i%6)
		name := fmt.Sprintf("m%03d", i)
		order[key] = append(order[key], name)
		msgs = append(msgs, &keyorder.Message{ID: f.t.Name() + "/" + name, Key: key, Payload: []byte(name)})
	}
	if _, err := p.PublishBatch(f.ctx, msgs); err != nil {
		f.t.Fatal(err)
	}
	slow := func(ctx context.Context, d *keyorder.Delivery) error {
		select {
		case <-time.After(f.unit / 10):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	first := f.subscribe(&subscribe.Config{Workers: 4}, slow)
	f.waitFor(100, "some handled", func() bool { return len(f.rec.succeeded("*")) >= n/4 })
	first.stop(f.t)
	if len(f.rec.runningNow()) != 0 {
		f.t.Fatalf("handlers still running after shutdown: %v", f.rec.runningNow())
	}
	mid := len(f.rec.succeeded("*"))
	if mid >= n {
		f.t.Fatalf("all %d handled before shutdown; the case needs a slower handler", n)
	}
	f.subscribe(&subscribe.Config{Workers: 4}, nil)
	f.waitFor(200, "all handled", func() bool {
		seen := map[string]bool{}
		for _, s := range f.rec.succeeded("*") {
			seen[s] = true
		}
		return len(seen) == n
	})
	for key, names := range order {
		var firstDone []string
		for _, s := range f.rec.succeeded(key) {
			if !slices.Contains(firstDone, s) {
				firstDone = append(firstDone, s)
			}
		}
		if !slices.Equal(firstDone, names) {
			f.t.Errorf("key %s completed in order %v, published %v", key, firstDone, names)
		}
	}
}

// shutdownWhileHeld stops a subscriber while a group waits for a retry
// (RetryAfter) with messages behind it, and another group has finished: the
// next subscriber handles the held group from its head, in order, and
// nothing is lost or dead-lettered.
func shutdownWhileHeld(f *fixture) {
	p := f.publisher(nil)
	f.publish(p, "a1:A", "a2:A", "a3:A", "b1:B", "b2:B")
	first := f.subscribe(&subscribe.Config{Workers: 2, Retry: policy.Retry{MaxAttempts: 3}},
		failOnce("a1", keyorder.RetryAfter(errors.New("later"), 30*f.unit)))
	f.waitFor(20, "a1 failed and group B handled", func() bool {
		return len(f.rec.succeeded("B")) == 2 && len(f.rec.starts("A")) == 1 && len(f.rec.runningNow()) == 0
	})
	first.stop(f.t)
	second := f.subscribe(&subscribe.Config{Workers: 2, Retry: policy.Retry{MaxAttempts: 3}}, nil)
	f.waitFor(60, "group A handled", func() bool { return slices.Contains(f.rec.succeeded("A"), "a3") })
	if got, want := f.rec.starts("A"), []string{"a1", "a1", "a2", "a3"}; !slices.Equal(got, want) {
		f.t.Fatalf("group A handled %v, want %v", got, want)
	}
	if got := f.rec.starts("B"); !slices.Equal(got, []string{"b1", "b2"}) {
		f.t.Fatalf("group B handled %v, want b1 b2 once each", got)
	}
	if n := counts(first.sub).DeadLettered + counts(second.sub).DeadLettered; n != 0 {
		f.t.Fatalf("%d messages dead-lettered", n)
	}
}

// exactBytesAndKnowableLimits: what the backend accepts arrives byte for
// byte (binary and invalid-UTF-8 payloads, control characters, non-ASCII
// keys and header values), and a message it would refuse for a reason
// knowable before sending fails in Publish with a LimitError, sends
// nothing and does not pause its key: the key's next valid message is sent.
func exactBytesAndKnowableLimits(f *fixture) {
	p := f.publisher(nil)
	lim := p.Limits()
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	valid := []*keyorder.Message{
		{ID: "v1", Key: "K", Payload: all, Headers: map[string]string{"x-ctl": "tab\t cr\r lf\n ctl\x01\x1f del\x7f", "x-empty": "", "x-uni": "ünï ✓ 😀 \u2028 \ufffd"}},
		{ID: "v2", Key: "K", Payload: []byte("\xff\xfe\x00 not UTF-8 \xc3\x28")},
		{ID: "v3", Key: "K", Payload: []byte("line1\r\nline2\rline3\n  trailing  ")},
		{ID: "v4", Key: "ключ 😀 with spaces/and:colons", Payload: []byte("{\"json\": \"\\u0000\"}")},
		{ID: "v5", Key: strings.Repeat("é", 60), Payload: []byte("x")},
	}
	type bad struct {
		what string
		m    *keyorder.Message
	}
	bads := []bad{
		{"NUL in a header value", &keyorder.Message{Headers: map[string]string{"x-a": "a\x00b"}}},
		{"invalid UTF-8 in a header value", &keyorder.Message{Headers: map[string]string{"x-a": "\xff"}}},
		{"reserved header name", &keyorder.Message{Headers: map[string]string{"keyorder-id": "forged"}}},
		{"NUL in the key", &keyorder.Message{Key: "K\x00"}},
		{"invalid UTF-8 in the ID", &keyorder.Message{ID: "id-\xd1"}},
	}
	if lim.MaxHeaders > 0 {
		h := map[string]string{}
		for i := range lim.MaxHeaders + 1 {
			h[fmt.Sprintf("x-h%d", i)] = "v"
		}
		bads = append(bads, bad{"one header over the limit", &keyorder.Message{Headers: h}})
	}
	if lim.MaxHeaderValueBytes > 0 {
		bads = append(bads, bad{"header value over the limit", &keyorder.Message{Headers: map[string]string{"x-a": strings.Repeat("v", lim.MaxHeaderValueBytes+1)}}})
	}
	if lim.MaxPayloadBytes > 0 {
		// Within MaxPayloadBytes, but a backend that encodes binary
		// payloads (SQS: base64) may refuse it: then it must be a
		// LimitError before sending, like the rest.
		payload := slices.Repeat([]byte{0xff}, lim.MaxPayloadBytes)
		if driver.Validate(lim, &driver.Message{Key: "K", Payload: payload}) != nil {
			bads = append(bads, bad{"binary payload over the encoded size", &keyorder.Message{Payload: payload}})
		}
	}
	after := 0
	for _, b := range bads {
		m := b.m
		if m.Key == "" {
			m.Key = "K"
		}
		if m.Payload == nil {
			m.Payload = []byte("bad")
		}
		var le *keyorder.LimitError
		if _, err := p.Publish(f.ctx, m); !errors.As(err, &le) || !errors.Is(err, keyorder.ErrInvalidMessage) || keyorder.Code(err) != keyorder.CodeInvalidArgument {
			f.t.Errorf("%s: Publish = %v, want a LimitError", b.what, err)
		}
		after++
		next := &keyorder.Message{ID: fmt.Sprintf("after%d", after), Key: "K", Payload: []byte("after")}
		if _, err := p.Publish(f.ctx, next); err != nil {
			f.t.Errorf("next valid message after %s: %v (the key was paused)", b.what, err)
		}
	}
	for _, m := range valid {
		if _, err := p.Publish(f.ctx, m); err != nil {
			f.t.Fatalf("publish %s: %v", m.ID, err)
		}
	}
	if got := p.Paused(); len(got) != 0 {
		f.t.Errorf("paused keys %v", got)
	}
	var mu sync.Mutex
	got := map[string]keyorder.Message{}
	f.subscribe(nil, func(_ context.Context, d *keyorder.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		got[d.ID] = d.Message
		if d.Subscription == "" || strings.Contains(d.Subscription, "://") {
			f.t.Errorf("Delivery.Subscription = %q, want the subscription's name", d.Subscription)
		}
		return nil
	})
	want := len(valid) + after
	f.waitFor(40, "every valid message handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= want
	})
	mu.Lock()
	defer mu.Unlock()
	for _, m := range valid {
		d, ok := got[m.ID]
		if !ok {
			f.t.Errorf("%s not delivered", m.ID)
			continue
		}
		wantH := maps.Clone(m.Headers) // nil when it had none
		if d.Key != m.Key || !bytes.Equal(d.Payload, m.Payload) || !maps.Equal(d.Headers, wantH) {
			f.t.Errorf("%s changed in transit:\n sent key %q payload %q headers %q\n got  key %q payload %q headers %q",
				m.ID, m.Key, m.Payload, wantH, d.Key, d.Payload, d.Headers)
		}
	}
	for id := range got {
		if strings.HasPrefix(id, "after") || slices.ContainsFunc(valid, func(m *keyorder.Message) bool { return m.ID == id }) {
			continue
		}
		f.t.Errorf("unexpected delivery %q: a rejected message was sent", id)
	}
}
