package subscribe_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// flaky decides, per settlement call, whether the memory broker fails it,
// and counts what it did.
type flaky struct {
	mu       sync.Mutex
	calls    map[memhook.Op]int
	injected map[memhook.Op]int
	rule     func(op memhook.Op, n int, ms []*driver.Message) memhook.Fault
}

func newFlaky(rule func(op memhook.Op, n int, ms []*driver.Message) memhook.Fault) *flaky {
	return &flaky{calls: map[memhook.Op]int{}, injected: map[memhook.Op]int{}, rule: rule}
}

func (f *flaky) fault(op memhook.Op, ms []*driver.Message) memhook.Fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[op]++
	ft := f.rule(op, f.calls[op], ms)
	if ft.Err != nil {
		f.injected[op]++
	}
	return ft
}

func (f *flaky) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, op := range []memhook.Op{memhook.OpAck, memhook.OpNack, memhook.OpRelease, memhook.OpDeadLetter, memhook.OpExtendLeases} {
		fmt.Fprintf(&b, " %s %d/%d", op, f.injected[op], f.calls[op])
	}
	return b.String()
}

func (f *flaky) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, v := range f.injected {
		n += v
	}
	return n
}

func transient(op memhook.Op) error {
	return fmt.Errorf("%s: connection reset: %w", op, memhook.ErrTransient)
}

// run is one handler call as the test saw it.
type run struct {
	id      string
	attempt int
}

// A flaky network fails every other settlement call (and three lease
// renewals in four) with a transient error. The subscriber retries them, so
// the run is the one a healthy network gives: every message handled once
// (twice where the handler failed on purpose), dead letters only for the
// permanent failures and with their reasons, no lease lost, no message
// returned unhandled charged an attempt, and per key the publish order.
func TestSettlementRetriedUnderTransientFailures(t *testing.T) {
	for _, hold := range []memory.Hold{memory.Native, memory.InProcess} {
		name := map[memory.Hold]string{memory.Native: "Native", memory.InProcess: "InProcess"}[hold]
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { settleUnderTransientFailures(t, hold) })
		})
	}
}

func settleUnderTransientFailures(t *testing.T, hold memory.Hold) {
	const keys, perKey = 6, 12
	w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: hold, Chain: 3, Lease: 9 * time.Second})
	net := newFlaky(func(op memhook.Op, n int, ms []*driver.Message) memhook.Fault {
		if op == memhook.OpExtendLeases {
			if n%4 != 0 { // three in a row fail: a lease not renewed for 9s is lost
				return memhook.Fault{Err: transient(op)}
			}
			return memhook.Fault{}
		}
		if n%2 == 1 {
			return memhook.Fault{Err: transient(op)}
		}
		return memhook.Fault{}
	})
	if err := memhook.Of(w.b).FailSettlements("s", net.fault); err != nil {
		t.Fatal(err)
	}
	id := func(k, i int) string { return fmt.Sprintf("k%d-%02d", k, i) }
	failsOnce := func(i int) bool { return i%4 == 1 }
	permanent := func(k, i int) bool { return i == 6 && k%2 == 0 }

	// Published before the subscriber starts, so receives take whole
	// chains and a failing chain member (i%4 == 1, or a permanent one)
	// mostly has members received behind it that go back through Release.
	// With publishing and receiving interleaved, 1 run in 1,000 made no
	// Release call at all and failed the check below; published first,
	// 1,000 runs made 2 to 9 Release calls each.
	for i := range perKey {
		for k := range keys {
			w.publish(t, id(k, i), fmt.Sprintf("K%d", k))
		}
	}
	var mu sync.Mutex
	var runs []run
	s, stop := w.start(t, nil, &subscribe.Config{Workers: 4, Retry: policy.Retry{MaxAttempts: 3}},
		func(ctx context.Context, d *keyorder.Delivery) error {
			mu.Lock()
			runs = append(runs, run{d.ID, d.Attempt})
			mu.Unlock()
			var k, i int
			fmt.Sscanf(d.ID, "k%d-%d", &k, &i)
			if i%5 == 0 {
				time.Sleep(7 * time.Second) // spans lease renewals
			} else {
				time.Sleep(time.Second)
			}
			switch {
			case permanent(k, i):
				return keyorder.Permanent(errors.New("account closed"))
			case failsOnce(i) && d.Attempt == 1:
				return errors.New("balance service timed out")
			}
			return nil
		})
	stop = stopOnce(stop)
	defer stop()
	time.Sleep(10 * time.Minute)
	synctest.Wait()
	stop()
	st := counts(s)

	// Expected handler runs per key: each message once, twice if it fails
	// once on purpose, and permanent ones once.
	wantRuns, planned := 0, 0
	var wantDead []string
	for k := range keys {
		var want, got []run
		for i := range perKey {
			want = append(want, run{id(k, i), 1})
			if failsOnce(i) && !permanent(k, i) {
				want = append(want, run{id(k, i), 2})
				planned++
			}
			if permanent(k, i) {
				wantDead = append(wantDead, id(k, i))
			}
		}
		mu.Lock()
		for _, r := range runs {
			if strings.HasPrefix(r.id, fmt.Sprintf("k%d-", k)) {
				got = append(got, r)
			}
		}
		mu.Unlock()
		if !slices.Equal(got, want) {
			t.Errorf("key K%d ran (id, attempt)\n  %v\nwant\n  %v", k, got, want)
		}
		wantRuns += len(want)
	}
	dl, err := s.DeadLetters(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	var gotDead []string
	for _, d := range dl {
		gotDead = append(gotDead, d.Message.ID)
		if !strings.Contains(d.Reason, "account closed") || d.Attempts != 1 {
			t.Errorf("dead letter %s: reason %q, attempts %d; want the handler's reason and 1 attempt", d.Message.ID, d.Reason, d.Attempts)
		}
	}
	slices.Sort(gotDead)
	slices.Sort(wantDead)
	if !slices.Equal(gotDead, wantDead) {
		t.Errorf("dead letters %v, want %v", gotDead, wantDead)
	}
	if n := st.LeasesLost; n != 0 {
		t.Errorf("%d leases lost, want 0", n)
	}
	if n := st.Suppressed; n != 0 {
		t.Errorf("%d redeliveries of acknowledged messages, want 0 (every acknowledgement landed)", n)
	}
	if n := st.SettleFailures; n != 0 {
		t.Errorf("%d settlements given up, want 0", n)
	}
	ops := []memhook.Op{memhook.OpAck, memhook.OpDeadLetter, memhook.OpExtendLeases}
	if hold == memory.Native {
		ops = append(ops, memhook.OpNack, memhook.OpRelease)
	}
	net.mu.Lock()
	for _, op := range ops {
		if net.injected[op] == 0 {
			t.Errorf("no %s failure injected: the test does not exercise it", op)
		}
	}
	net.mu.Unlock()
	mu.Lock()
	handled := len(runs)
	mu.Unlock()
	t.Logf("messages %d, planned handler failures %d, permanent %d; handler runs %d (want %d); "+
		"injected failures %d (failed/calls:%s); settlement retries %d; given up %d; leases lost %d; suppressed %d",
		keys*perKey, planned, len(wantDead), handled, wantRuns, net.total(), net,
		st.SettleRetries, st.SettleFailures, st.LeasesLost, st.Suppressed)
}

// A settlement call is retried while the driver calls its error
// retryable, and no further once it is not: the broker then redelivers the
// message when its lease expires; an acknowledged one is acknowledged again
// and a dead-lettered one dead-lettered again, neither run again. Nothing
// is lost and no handler runs twice.
func TestSettlementStopsAtPermanentFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Lease: 9 * time.Second})
		permanentErr := errors.New("access denied")
		net := newFlaky(func(op memhook.Op, n int, ms []*driver.Message) memhook.Fault {
			// The first Ack, Nack and DeadLetter: one transient failure,
			// then a permanent one.
			if (op == memhook.OpAck || op == memhook.OpNack || op == memhook.OpDeadLetter) && n <= 2 {
				if n == 1 {
					return memhook.Fault{Err: transient(op)}
				}
				return memhook.Fault{Err: permanentErr}
			}
			return memhook.Fault{}
		})
		if err := memhook.Of(w.b).FailSettlements("s", net.fault); err != nil {
			t.Fatal(err)
		}
		var log startLog
		s, stop := w.start(t, nil, &subscribe.Config{Workers: 2}, func(ctx context.Context, d *keyorder.Delivery) error {
			log.add(fmt.Sprintf("%s#%d", d.ID, d.Attempt))
			switch {
			case d.ID == "b1" && d.Attempt == 1:
				return errors.New("fail once")
			case d.ID == "c1":
				return keyorder.Permanent(errors.New("account closed"))
			}
			return nil
		})
		stop = stopOnce(stop)
		defer stop()
		w.publish(t, "a1", "A")
		time.Sleep(20 * time.Second) // a1 settled (its redelivery too)
		w.publish(t, "b1", "B")
		time.Sleep(20 * time.Second)
		w.publish(t, "c1", "C")
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		net.mu.Lock()
		ackCalls, nackCalls, dlCalls := net.calls[memhook.OpAck], net.calls[memhook.OpNack], net.calls[memhook.OpDeadLetter]
		net.mu.Unlock()
		// a1: ack fails transiently, then permanently: 2 calls, given up;
		// redelivered at lease expiry, suppressed, acknowledged (3rd call).
		// b1: ack of its retry (4th). Nack: 2 calls, given up; b1
		// redelivered at lease expiry as attempt 2.
		// c1: DeadLetter fails transiently, then permanently: 2 calls,
		// given up; its redelivery is dead-lettered (3rd call) without
		// running again.
		if ackCalls != 4 || nackCalls != 2 || dlCalls != 3 {
			t.Errorf("Ack called %d times, Nack %d, DeadLetter %d; want 4, 2 and 3 (retried once each, then given up)", ackCalls, nackCalls, dlCalls)
		}
		if got, want := log.get(), []string{"a1#1", "b1#1", "b1#2", "c1#1"}; !slices.Equal(got, want) {
			t.Errorf("handler ran %v, want %v", got, want)
		}
		dl, err := s.DeadLetters(context.Background(), 0)
		if err != nil || len(dl) != 1 || dl[0].Message.ID != "c1" || dl[0].Attempts != 1 || !strings.Contains(dl[0].Reason, "account closed") {
			t.Errorf("dead letters %+v, %v; want c1 with its reason after 1 attempt", dl, err)
		}
		st := counts(s)
		if st.Suppressed != 1 || st.SettleFailures != 3 || st.SettleRetries != 3 {
			t.Errorf("suppressed %d, settlements given up %d, retries %d; want 1, 3, 3",
				st.Suppressed, st.SettleFailures, st.SettleRetries)
		}
		t.Logf("injected failures %d (failed/calls:%s); handler runs %v; retries %d; given up %d; suppressed %d",
			net.total(), net, log.get(), st.SettleRetries, st.SettleFailures, st.Suppressed)
	})
}

// deadLetterLost answers the first DeadLetter of each message as a broker
// does that found its lease lost: with an error and without effect.
type deadLetterLost struct {
	driver.Subscription
	mu     sync.Mutex
	tried  map[string]int
	landed map[string]time.Time
}

func (d *deadLetterLost) DeadLetter(ctx context.Context, m *driver.Message, reason string, attempts int) error {
	d.mu.Lock()
	d.tried[m.ID]++
	first := d.tried[m.ID] == 1
	d.mu.Unlock()
	if first {
		return errors.New("dead letter: lease lost")
	}
	err := d.Subscription.DeadLetter(ctx, m, reason, attempts)
	if err == nil {
		d.mu.Lock()
		d.landed[m.ID] = time.Now()
		d.mu.Unlock()
	}
	return err
}

// TestDeadLetterNotLandedHoldsKey: under Ordered with native hold, a
// DeadLetter that does not land (its answer says the lease was lost)
// leaves the message to its redelivery, so the rest of its chain (a2,
// received with it) goes back and waits for it: a2 starts only after a1,
// redelivered when its lease ran out, was dead-lettered. Before the fix
// a2 ran at once, 30 s before a1's dead letter landed (class settleLost of
// TestPropertyPromiseUnderModelBroker, seeds 3859, 3421, 211).
func TestDeadLetterNotLandedHoldsKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: memory.Native, Chain: 2, Lease: 30 * time.Second})
		raw, err := memhook.Of(w.b).SubscriptionDriver("s")
		if err != nil {
			t.Fatal(err)
		}
		drv := &deadLetterLost{Subscription: raw, tried: map[string]int{}, landed: map[string]time.Time{}}
		publishAll(t, w, "A", "a1", "a2")
		var mu sync.Mutex
		started := map[string]time.Time{}
		_, stop := w.start(t, drv, nil, func(ctx context.Context, d *keyorder.Delivery) error {
			mu.Lock()
			if _, ok := started[d.ID]; !ok {
				started[d.ID] = time.Now()
			}
			mu.Unlock()
			if d.ID == "a1" {
				return keyorder.Permanent(errors.New("poison"))
			}
			return nil
		})
		defer stop()
		time.Sleep(5 * time.Minute)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		drv.mu.Lock()
		defer drv.mu.Unlock()
		at, ok := drv.landed["a1"]
		if !ok {
			t.Fatalf("a1 never dead-lettered (DeadLetter tried %d times)", drv.tried["a1"])
		}
		a2, ok := started["a2"]
		if !ok {
			t.Fatal("a2 never ran")
		}
		if a2.Before(at) {
			t.Fatalf("a2 started %v before a1's dead letter landed (its first DeadLetter did not)", at.Sub(a2))
		}
	})
}
