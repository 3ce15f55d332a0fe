package subscribe_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
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

// log records handler starts in order.
type startLog struct {
	mu sync.Mutex
	s  []string
}

func (l *startLog) add(id string) {
	l.mu.Lock()
	l.s = append(l.s, id)
	l.mu.Unlock()
}

// stopOnce makes a stop function safe to defer and to call.
func stopOnce(stop func()) func() {
	var once sync.Once
	return func() { once.Do(stop) }
}

func (l *startLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.s)
}

// A key parked in process (its head waiting for a retry) must hold only
// itself: the successors the broker streams behind it must not use up the
// flow-control budget and stop every other key.
func TestParkedKeyDoesNotStarveOtherKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: memory.InProcess})
		var log startLog
		_, stop := w.start(t, nil, &subscribe.Config{Workers: 2}, func(ctx context.Context, d *keyorder.Delivery) error {
			log.add(d.ID)
			if d.ID == "a1" && d.Attempt == 1 {
				return keyorder.RetryAfter(errors.New("later"), time.Minute)
			}
			return nil
		})
		stop = stopOnce(stop)
		defer stop()
		for _, id := range []string{"a1", "a2", "a3", "a4", "a5", "a6"} {
			w.publish(t, id, "A")
		}
		synctest.Wait()
		w.publish(t, "b1", "B")
		synctest.Wait()
		if got := log.get(); !slices.Contains(got, "b1") {
			t.Fatalf("handled %v before a1's retry: key B was held by A's parked head", got)
		}
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		stop()
		var a []string
		for _, id := range log.get() {
			if id[0] == 'a' {
				a = append(a, id)
			}
		}
		if want := []string{"a1", "a1", "a2", "a3", "a4", "a5", "a6"}; !slices.Equal(a, want) {
			t.Fatalf("key A handled %v, want %v", a, want)
		}
	})
}

// The same for a key held by a message published with a delay.
func TestDelayedKeyDoesNotStarveOtherKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: memory.InProcess})
		var log startLog
		_, stop := w.start(t, nil, &subscribe.Config{Workers: 2}, func(ctx context.Context, d *keyorder.Delivery) error {
			log.add(d.ID)
			return nil
		})
		stop = stopOnce(stop)
		defer stop()
		if _, err := w.pub.Publish(context.Background(), &keyorder.Message{ID: "a1", Key: "A", Payload: []byte("a1"), NotBefore: time.Now().Add(time.Minute)}); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"a2", "a3", "a4", "a5", "a6"} {
			w.publish(t, id, "A")
		}
		synctest.Wait()
		w.publish(t, "b1", "B")
		synctest.Wait()
		if got := log.get(); !slices.Equal(got, []string{"b1"}) {
			t.Fatalf("handled %v before a1's not-before time, want just b1", got)
		}
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		stop()
		if got, want := log.get(), []string{"b1", "a1", "a2", "a3", "a4", "a5", "a6"}; !slices.Equal(got, want) {
			t.Fatalf("handled %v, want %v", got, want)
		}
	})
}

// leaseSkipper does not extend the lease of one message for a while, as
// when one renewal fails or comes too late, while the others are renewed.
type leaseSkipper struct {
	driver.Subscription
	mu    sync.Mutex
	id    string
	until time.Time
}

func (s *leaseSkipper) skip(id string, d time.Duration) {
	s.mu.Lock()
	s.id, s.until = id, time.Now().Add(d)
	s.mu.Unlock()
}

func (s *leaseSkipper) ExtendLeases(ctx context.Context, ms []*driver.Message) ([]*driver.Message, error) {
	s.mu.Lock()
	id, skipping := s.id, time.Now().Before(s.until)
	s.mu.Unlock()
	if skipping {
		ms = slices.DeleteFunc(slices.Clone(ms), func(m *driver.Message) bool { return m.ID == id })
	}
	return s.Subscription.ExtendLeases(ctx, ms)
}

// When the head of a chain (several messages of a key from one receive on a
// broker that holds groups) loses its lease, the broker will redeliver it:
// the rest of the chain must go back unhandled, not run before it.
func TestChainHeadLostLeaseReturnsRestOfChain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Chain: 2, Lease: 9 * time.Second})
		w.publish(t, "a1", "A")
		w.publish(t, "a2", "A")
		raw, _ := memhook.Of(w.b).SubscriptionDriver("s")
		drv := &leaseSkipper{Subscription: raw}
		var log startLog
		_, stop := w.start(t, drv, nil, func(ctx context.Context, d *keyorder.Delivery) error {
			log.add(d.ID)
			if d.ID == "a1" && d.Attempt == 1 {
				drv.skip("a1", 10*time.Second)
				<-ctx.Done()
				return ctx.Err()
			}
			return nil
		})
		stop = stopOnce(stop)
		defer stop()
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		if got, want := log.get(), []string{"a1", "a1", "a2"}; !slices.Equal(got, want) {
			t.Fatalf("handled %v, want %v: a2 ran before a1 was redelivered", got, want)
		}
	})
}

// A redelivery that arrives while the original is still running (its lease
// lost) waits behind it in its lane; once the original succeeds, the
// redelivery is of an acknowledged message and must not run again.
func TestRedeliveryBehindRunningOriginalIsSuppressed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Lease: 9 * time.Second})
		raw, _ := memhook.Of(w.b).SubscriptionDriver("s")
		drv := &stallingLeases{Subscription: raw}
		var calls atomic.Int32
		s, stop := w.start(t, drv, nil, func(ctx context.Context, d *keyorder.Delivery) error {
			if calls.Add(1) == 1 {
				drv.stall(30 * time.Second)
				time.Sleep(20 * time.Second) // ignores its context
			}
			return nil
		})
		stop = stopOnce(stop)
		defer stop()
		w.publish(t, "m1", "k")
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		if calls.Load() != 1 || counts(s).Suppressed < 1 {
			t.Fatalf("handler calls = %d, suppressed = %d; want 1 and at least 1", calls.Load(), counts(s).Suppressed)
		}
	})
}

// slowExtend takes a while to renew leases, during which a handler may
// finish and its message be acknowledged.
type slowExtend struct {
	driver.Subscription
}

func (s slowExtend) ExtendLeases(ctx context.Context, ms []*driver.Message) ([]*driver.Message, error) {
	time.Sleep(time.Second)
	return s.Subscription.ExtendLeases(ctx, ms)
}

// A message acknowledged while its lease was being renewed is gone from the
// broker by the time the renewal reaches it; that is not a lost lease.
func TestSettledDuringExtensionIsNotLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Lease: 3 * time.Second})
		raw, _ := memhook.Of(w.b).SubscriptionDriver("s")
		s, stop := w.start(t, slowExtend{raw}, nil, func(ctx context.Context, d *keyorder.Delivery) error {
			time.Sleep(1500 * time.Millisecond) // finishes while the first renewal is under way
			return nil
		})
		stop = stopOnce(stop)
		defer stop()
		w.publish(t, "m1", "k")
		time.Sleep(10 * time.Second)
		synctest.Wait()
		stop()
		if n := counts(s).LeasesLost; n != 0 || counts(s).Acked != 1 {
			t.Fatalf("leases lost = %d, acked = %d; want 0 and 1", n, counts(s).Acked)
		}
	})
}

// In-process hold: the head of a key is parked for its retry when its lease
// (and those of the messages behind it) is lost; the broker redelivers the
// key from the head. The stale copies must not run, and the redelivered
// head runs before the rest.
func TestLeaseLostWhileParkedInProcess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: memory.InProcess, Lease: 9 * time.Second})
		raw, _ := memhook.Of(w.b).SubscriptionDriver("s")
		drv := &stallingLeases{Subscription: raw}
		var log startLog
		var attempts []int
		s, stop := w.start(t, drv, nil, func(ctx context.Context, d *keyorder.Delivery) error {
			log.add(d.ID)
			if d.ID == "a1" {
				attempts = append(attempts, d.Attempt)
				if d.Attempt == 1 {
					drv.stall(15 * time.Second) // the leases of a1..a3 run out while a1 is parked
					return keyorder.RetryAfter(errors.New("later"), 30*time.Second)
				}
			}
			return nil
		})
		stop = stopOnce(stop)
		defer stop()
		w.pub.PublishBatch(context.Background(), []*keyorder.Message{
			{ID: "a1", Key: "A", Payload: []byte("1")}, {ID: "a2", Key: "A", Payload: []byte("2")}, {ID: "a3", Key: "A", Payload: []byte("3")},
		})
		time.Sleep(20 * time.Second)
		if got := log.get(); !slices.Equal(got, []string{"a1"}) {
			t.Fatalf("handled %v while a1 was parked", got)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		if got, want := log.get(), []string{"a1", "a1", "a2", "a3"}; !slices.Equal(got, want) {
			t.Fatalf("handled %v, want %v", got, want)
		}
		if attempts[1] < 2 || counts(s).LeasesLost != 3 {
			t.Fatalf("a1 attempts %v, leases lost %d; want the retry counted and 3 lost", attempts, counts(s).LeasesLost)
		}
	})
}

// A handler may keep the Delivery it was given: a retry of the message gets
// a Delivery of its own.
func TestKeptDeliveryIsNotReused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: memory.InProcess})
		var kept []*keyorder.Delivery
		_, stop := w.start(t, nil, nil, func(ctx context.Context, d *keyorder.Delivery) error {
			kept = append(kept, d)
			if d.Attempt == 1 {
				return errors.New("once")
			}
			return nil
		})
		stop = stopOnce(stop)
		defer stop()
		w.publish(t, "m1", "k")
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		if len(kept) != 2 || kept[0].Attempt != 1 || kept[1].Attempt != 2 {
			t.Fatalf("kept deliveries have attempts %d and %d, want 1 and 2", kept[0].Attempt, kept[len(kept)-1].Attempt)
		}
	})
}

// errWithMessages returns its first receive's messages together with a
// transient error.
type errWithMessages struct {
	driver.Subscription
	once sync.Once
}

func (e *errWithMessages) Receive(ctx context.Context, n int) ([]*driver.Message, error) {
	ms, err := e.Subscription.Receive(ctx, n)
	failed := false
	e.once.Do(func() { failed = true })
	if err == nil && failed {
		return ms, fmt.Errorf("stream broke: %w", memhook.ErrTransient)
	}
	return ms, err
}

// Messages a driver returns along with an error go back to the broker and
// give back their flow-control tokens.
func TestReceiveErrorWithMessagesLeaksNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered})
		raw, _ := memhook.Of(w.b).SubscriptionDriver("s")
		var log startLog
		_, stop := w.start(t, &errWithMessages{Subscription: raw}, &subscribe.Config{MaxOutstanding: 1}, func(ctx context.Context, d *keyorder.Delivery) error {
			log.add(d.ID)
			return nil
		})
		stop = stopOnce(stop)
		defer stop()
		w.publish(t, "m1", "k")
		w.publish(t, "m2", "k")
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		if got := log.get(); !slices.Equal(got, []string{"m1", "m2"}) {
			t.Fatalf("handled %v, want m1 m2", got)
		}
	})
}

// visibilityDriver records, like a broker where a lease renewal and a nack
// both set a message's visibility, whether a renewal reached the broker
// after the message had been nacked (which would undo the nack's delay).
type visibilityDriver struct {
	driver.Subscription
	mu     sync.Mutex
	nacked map[string]bool
	undone []string
}

func (v *visibilityDriver) ExtendLeases(ctx context.Context, ms []*driver.Message) ([]*driver.Message, error) {
	time.Sleep(time.Second) // on its way to the broker
	v.mu.Lock()
	for _, m := range ms {
		if v.nacked[m.ID] {
			v.undone = append(v.undone, m.ID)
		}
	}
	v.mu.Unlock()
	return v.Subscription.ExtendLeases(ctx, ms)
}

func (v *visibilityDriver) Nack(ctx context.Context, m *driver.Message, d time.Duration) error {
	v.mu.Lock()
	v.nacked[m.ID] = true
	v.mu.Unlock()
	return v.Subscription.Nack(ctx, m, d)
}

// A renewal under way when a handler fails must not reach the broker after
// the nack.
func TestNoLeaseRenewalAfterNack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Lease: 3 * time.Second})
		raw, _ := memhook.Of(w.b).SubscriptionDriver("s")
		drv := &visibilityDriver{Subscription: raw, nacked: map[string]bool{}}
		_, stop := w.start(t, drv, nil, func(ctx context.Context, d *keyorder.Delivery) error {
			if d.Attempt == 1 {
				time.Sleep(1500 * time.Millisecond) // fails while the first renewal is under way
				return errors.New("fail")
			}
			return nil
		})
		stop = stopOnce(stop)
		defer stop()
		w.publish(t, "m1", "k")
		time.Sleep(10 * time.Second)
		synctest.Wait()
		stop()
		if len(drv.undone) != 0 {
			t.Fatalf("lease renewals of %v reached the broker after their nack", drv.undone)
		}
	})
}

// slowAckReturn acknowledges at once but is slow to return, as a call
// whose reply is delayed.
type slowAckReturn struct {
	driver.Subscription
}

func (s slowAckReturn) Ack(ctx context.Context, ms []*driver.Message) error {
	err := s.Subscription.Ack(ctx, ms)
	time.Sleep(2 * time.Second)
	return err
}

// A renewal while an acknowledgement is on its way back does not count the
// acknowledged message as a lost lease.
func TestAckedDuringExtensionIsNotLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Lease: 3 * time.Second})
		raw, _ := memhook.Of(w.b).SubscriptionDriver("s")
		s, stop := w.start(t, slowAckReturn{raw}, nil, func(ctx context.Context, d *keyorder.Delivery) error {
			time.Sleep(500 * time.Millisecond)
			return nil
		})
		stop = stopOnce(stop)
		defer stop()
		w.publish(t, "m1", "k")
		time.Sleep(10 * time.Second)
		synctest.Wait()
		stop()
		if n := counts(s).LeasesLost; n != 0 {
			t.Fatalf("leases lost = %d, want 0", n)
		}
	})
}

// A broker that streams a key (Pub/Sub; memory's InProcess shape)
// redelivers, when a message's lease runs out, the key's later messages
// too, dead-lettered ones included. Such a redelivery of a message this
// process dead-lettered must not run again (it would run after messages of
// its key that ran after it was dead-lettered, and be dead-lettered twice):
// it is acknowledged, as a redelivery of an acknowledged message is. Found
// by TestPropertyPromiseUnderRandomScenarios.
func TestRedeliveryOfDeadLetteredCopyDoesNotRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Exclusive, Hold: memory.InProcess, Lease: 9 * time.Second})
		raw, _ := memhook.Of(w.b).SubscriptionDriver("s")
		drv := &stallingLeases{Subscription: raw}
		var log startLog
		s, stop := w.start(t, drv, nil, func(ctx context.Context, d *keyorder.Delivery) error {
			log.add(d.ID)
			switch {
			case d.ID == "a1" && d.Attempt == 1:
				drv.stall(15 * time.Second) // a1's lease runs out while it waits
				return keyorder.RetryAfter(errors.New("later"), 30*time.Second)
			case d.ID == "a2":
				return keyorder.Permanent(errors.New("poison"))
			}
			return nil
		})
		stop = stopOnce(stop)
		defer stop()
		w.publish(t, "a1", "A")
		w.publish(t, "a2", "A")
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		stop()
		var a2 int
		for _, id := range log.get() {
			if id == "a2" {
				a2++
			}
		}
		dead, _ := raw.DeadLetters(context.Background(), 0)
		if a2 != 1 || len(dead) != 1 {
			t.Fatalf("a2 ran %d times and %d dead letters were made (handled %v); want once and one", a2, len(dead), log.get())
		}
		if counts(s).Suppressed == 0 {
			t.Fatalf("no redelivery suppressed: the test did not make the broker redeliver a2")
		}
	})
}
