package memory_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/publish"
)

func send(t *testing.T, b *memory.Broker, specs ...[2]string) {
	t.Helper()
	var ms []*driver.Message
	for _, s := range specs {
		ms = append(ms, &driver.Message{ID: s[0], Key: s[1], Payload: []byte(s[0])})
	}
	if err := memhook.Of(b).TopicDriver("t").SendBatch(context.Background(), ms); err != nil {
		t.Fatal(err)
	}
}

func ids(ms []*driver.Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.ID)
	}
	return out
}

// InProcess plays Pub/Sub: a key streams to one consumer, and a lost lease
// brings the key's later messages back too, acknowledged or not.
func TestInProcessRedeliversSuccessors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := memory.NewBroker()
		b.CreateSubscription("t", "s", &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: memory.InProcess, Lease: 10 * time.Second})
		send(t, b, [2]string{"a1", "A"}, [2]string{"a2", "A"}, [2]string{"a3", "A"}, [2]string{"b1", "B"})
		ctx := context.Background()
		c1, _ := memhook.Of(b).SubscriptionDriver("s")
		c2, _ := memhook.Of(b).SubscriptionDriver("s")
		got, _ := c1.Receive(ctx, 3)
		if !slices.Equal(ids(got), []string{"a1", "a2", "a3"}) {
			t.Fatalf("c1 got %v; a key's successors stream while earlier ones are unsettled", ids(got))
		}
		other, _ := c2.Receive(ctx, 10)
		if !slices.Equal(ids(other), []string{"b1"}) {
			t.Fatalf("c2 got %v; key A belongs to c1 while it holds messages of A", ids(other))
		}
		c2.Ack(ctx, other)
		if err := c1.Ack(ctx, got[1:2]); err != nil { // a2 acked, a1 not
			t.Fatal(err)
		}
		time.Sleep(11 * time.Second) // c1 dies: a1's lease expires
		again, _ := c2.Receive(ctx, 10)
		if !slices.Equal(ids(again), []string{"a1", "a2", "a3"}) || again[0].Attempt != 2 || again[1].Attempt != 2 {
			t.Fatalf("after a1's lease expired c2 got %v (attempts %d, %d); want a1 a2 a3 again", ids(again), again[0].Attempt, again[1].Attempt)
		}
		if lost, _ := c1.ExtendLeases(ctx, got); len(lost) != 3 {
			t.Fatalf("c1's leases lost = %d, want 3", len(lost))
		}
	})
}

func TestNativeNackHoldsGroupAndChains(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := memory.NewBroker()
		b.CreateSubscription("t", "s", &memory.SubscriptionOptions{Ordering: policy.Ordered, Chain: 3})
		send(t, b, [2]string{"a1", "A"}, [2]string{"a2", "A"}, [2]string{"a3", "A"}, [2]string{"a4", "A"}, [2]string{"b1", "B"})
		ctx := context.Background()
		c, _ := memhook.Of(b).SubscriptionDriver("s")
		got, _ := c.Receive(ctx, 10)
		if !slices.Equal(ids(got), []string{"a1", "a2", "a3", "b1"}) {
			t.Fatalf("got %v, want a chain of 3 of A then b1", ids(got))
		}
		c.Nack(ctx, got[0], 5*time.Second)
		c.Release(ctx, got[1:3])
		c.Ack(ctx, got[3:])
		start := time.Now()
		next, _ := c.Receive(ctx, 1)
		if time.Since(start) != 5*time.Second || ids(next)[0] != "a1" || next[0].Attempt != 2 {
			t.Fatalf("after %v got %v attempt %d; want a1 (attempt 2) after the 5s hold", time.Since(start), ids(next), next[0].Attempt)
		}
		c.Ack(ctx, next)
		rest, _ := c.Receive(ctx, 1)
		if ids(rest)[0] != "a2" || rest[0].Attempt != 1 {
			t.Fatalf("got %v attempt %d; released chain members keep their place and attempt count", ids(rest), rest[0].Attempt)
		}
	})
}

func TestURLParameters(t *testing.T) {
	ctx := context.Background()
	o := &memory.URLOpener{Broker: memory.NewBroker()}
	mux := &driver.URLMux{}
	mux.RegisterTopic("mem", o)
	mux.RegisterSubscription("mem", o)
	for _, bad := range []string{
		"mem://t?subscription=s&ordering=fifo",
		"mem://t?subscription=s&hold=remote",
		"mem://t?subscription=s&lease=-1s",
		"mem://t?subscription=s&maxbatch=0",
		"mem://t?ordering=ordered",
		"mem://t?subscription=s&colour=blue",
	} {
		if _, err := mux.OpenSubscription(ctx, bad); !errors.Is(err, keyorder.ErrBadURL) {
			t.Errorf("OpenSubscription(%q) = %v, want ErrBadURL", bad, err)
		}
	}
	if _, err := mux.OpenSubscription(ctx, "mem://t?subscription=s&ordering=ordered&hold=inprocess&lease=5s&maxbatch=3"); err != nil {
		t.Fatal(err)
	}
	if _, err := mux.OpenSubscription(ctx, "mem://t?subscription=s&ordering=exclusive"); err == nil {
		t.Fatal("reopening a subscription with another ordering succeeded")
	}
	d, err := mux.OpenSubscription(ctx, "mem://t?subscription=s&ordering=ordered&hold=inprocess")
	if err != nil || d.Capabilities().NativeHold || d.Capabilities().Ordering != policy.Ordered {
		t.Fatalf("reopen = %v, %+v", err, d.Capabilities())
	}
	tp, err := mux.OpenTopic(ctx, "mem://p?payload=required&maxpayload=8")
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := publish.New(tp, nil)
	var le *keyorder.LimitError
	if _, err := pub.Publish(ctx, &keyorder.Message{Key: "k"}); !errors.As(err, &le) || le.Limit != "empty payload" {
		t.Fatalf("empty payload = %v", err)
	}
	if _, err := pub.Publish(ctx, &keyorder.Message{Key: "k", Payload: make([]byte, 9)}); !errors.As(err, &le) || le.Max != 8 || le.Got != 9 {
		t.Fatalf("payload over maxpayload = %v", err)
	}
}

// A message settles only on the subscription that delivered it.
func TestSettleOnAnotherSubscriptionFails(t *testing.T) {
	b := memory.NewBroker()
	b.CreateSubscription("t", "s1", &memory.SubscriptionOptions{Ordering: policy.Ordered})
	b.CreateSubscription("t", "s2", &memory.SubscriptionOptions{Ordering: policy.Ordered})
	send(t, b, [2]string{"m1", "k"})
	ctx := context.Background()
	c1, _ := memhook.Of(b).SubscriptionDriver("s1")
	c2, _ := memhook.Of(b).SubscriptionDriver("s2")
	m1, _ := c1.Receive(ctx, 1)
	m2, _ := c2.Receive(ctx, 1)
	if err := c2.Ack(ctx, m1); err == nil {
		t.Fatal("s2 acknowledged a message s1 delivered")
	}
	if lost, _ := c2.ExtendLeases(ctx, m2); len(lost) != 0 {
		t.Fatalf("s2's own lease was settled by the foreign ack")
	}
	if err := c2.Ack(ctx, m2); err != nil {
		t.Fatal(err)
	}
}

// InProcess: returning a key's head returns the key's later deliveries with
// it; none of them counts an attempt, and returning them all together is not
// an error.
func TestInProcessReleaseCountsNoAttempts(t *testing.T) {
	b := memory.NewBroker()
	b.CreateSubscription("t", "s", &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: memory.InProcess})
	send(t, b, [2]string{"a1", "A"}, [2]string{"a2", "A"}, [2]string{"a3", "A"})
	ctx := context.Background()
	c, _ := memhook.Of(b).SubscriptionDriver("s")
	got, _ := c.Receive(ctx, 10)
	if err := c.Release(ctx, got); err != nil {
		t.Fatalf("releasing a1 a2 a3 = %v", err)
	}
	again, _ := c.Receive(ctx, 10)
	if err := c.Release(ctx, again[:1]); err != nil { // a2, a3 come back with a1
		t.Fatal(err)
	}
	last, _ := c.Receive(ctx, 10)
	for _, m := range last {
		if m.Attempt != 1 {
			t.Fatalf("after two releases got %v with %s at attempt %d, want every attempt 1", ids(last), m.ID, m.Attempt)
		}
	}
	if !slices.Equal(ids(last), []string{"a1", "a2", "a3"}) {
		t.Fatalf("got %v", ids(last))
	}
}

// A crashed consumer reaches the broker no more: a Receive under way
// returns ErrCrashed, its settlements fail without effect, and its lease
// expires as a dead process's would, counting an attempt, so another
// consumer gets the message again.
func TestCrashedConsumerLeasesExpire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := memory.NewBroker()
		b.CreateSubscription("t", "s", &memory.SubscriptionOptions{Ordering: policy.Ordered, Lease: 10 * time.Second})
		send(t, b, [2]string{"a1", "A"}, [2]string{"a2", "A"})
		ctx := context.Background()
		c1, _ := memhook.Of(b).SubscriptionDriver("s")
		got, _ := c1.Receive(ctx, 1)
		if !slices.Equal(ids(got), []string{"a1"}) {
			t.Fatalf("c1 got %v", ids(got))
		}
		waiting := make(chan error, 1)
		go func() { _, err := c1.Receive(ctx, 1); waiting <- err }()
		synctest.Wait()
		c1.Crash()
		if err := <-waiting; !errors.Is(err, memhook.ErrCrashed) {
			t.Fatalf("Receive under way returned %v, want ErrCrashed", err)
		}
		if err := c1.Ack(ctx, got); !errors.Is(err, memhook.ErrCrashed) || c1.IsRetryable(err) {
			t.Fatalf("Ack after Crash returned %v (retryable %v), want permanent ErrCrashed", err, c1.IsRetryable(err))
		}
		c2, _ := memhook.Of(b).SubscriptionDriver("s")
		time.Sleep(9 * time.Second)
		rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		early, _ := c2.Receive(rctx, 1)
		cancel()
		if len(early) != 0 {
			t.Fatalf("c2 got %v before a1's lease expired", ids(early))
		}
		again, err := c2.Receive(ctx, 1)
		if err != nil || !slices.Equal(ids(again), []string{"a1"}) || again[0].Attempt != 2 {
			t.Fatalf("after the lease expired c2 got %v (%v); want a1 at attempt 2", ids(again), err)
		}
	})
}

// A message's first delivery carries the lease allocated with its entry;
// once that delivery is settled, its Message settles nothing, not even a
// later delivery of the same message (which has a lease of its own).
func TestEarlierDeliveryCannotSettleALaterOne(t *testing.T) {
	for _, hold := range []memory.Hold{memory.Native, memory.InProcess} {
		synctest.Test(t, func(t *testing.T) {
			b := memory.NewBroker()
			b.CreateSubscription("t", "s", &memory.SubscriptionOptions{Ordering: policy.Ordered, Hold: hold, Lease: 10 * time.Second})
			send(t, b, [2]string{"a1", "A"})
			ctx := context.Background()
			c, _ := memhook.Of(b).SubscriptionDriver("s")
			first, _ := c.Receive(ctx, 1)
			if err := c.Nack(ctx, first[0], 0); err != nil {
				t.Fatal(err)
			}
			second, _ := c.Receive(ctx, 1)
			if !slices.Equal(ids(second), []string{"a1"}) || second[0].Attempt != 2 {
				t.Fatalf("hold %v: redelivery %v attempt %d, want a1 attempt 2", hold, ids(second), second[0].Attempt)
			}
			if err := c.Ack(ctx, first); err == nil {
				t.Fatalf("hold %v: the first delivery's Message acknowledged the second delivery", hold)
			}
			if err := c.Ack(ctx, second); err != nil {
				t.Fatalf("hold %v: acking the second delivery: %v", hold, err)
			}
			if err := c.Ack(ctx, second); err == nil {
				t.Fatalf("hold %v: a settled delivery was settled again", hold)
			}
		})
	}
}

// An Ordering or Hold out of range is rejected with ErrInvalidConfig
// naming the field, and no subscription is made.
func TestCreateSubscriptionRejectsUnknownEnums(t *testing.T) {
	b := memory.NewBroker()
	for field, c := range map[string]*memory.SubscriptionOptions{
		"Ordering": {Ordering: policy.Ordering(99)},
		"Hold":     {Hold: memory.Hold(-1)},
	} {
		if err := b.CreateSubscription("t", "s", c); !errors.Is(err, keyorder.ErrInvalidConfig) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s out of range: %v, want ErrInvalidConfig naming it", field, err)
		}
		if _, err := memhook.Of(b).SubscriptionDriver("s"); err == nil {
			t.Errorf("%s out of range: the subscription was made", field)
		}
	}
}

// A consumer that dies holding a chain of a key loses its leases; only the
// message that may have been running (under Ordered and Exclusive the
// chain's first unsettled one) comes back with an attempt counted, as
// PostgreSQL counts (driver.Message.Attempt); the rest never ran.
func TestCrashHoldingChainCountsOnlyHead(t *testing.T) {
	type shape struct {
		name     string
		ordering policy.Ordering
		hold     memory.Hold
		settle   func(ctx context.Context, c memhook.Subscription, got []*driver.Message) error
		want     []int // attempts of a1 a2 a3 (and a4) at the next receive
	}
	nothing := func(context.Context, memhook.Subscription, []*driver.Message) error { return nil }
	ackFirst := func(ctx context.Context, c memhook.Subscription, got []*driver.Message) error {
		return c.Ack(ctx, got[:1])
	}
	nackFirst := func(ctx context.Context, c memhook.Subscription, got []*driver.Message) error {
		return c.Nack(ctx, got[0], 0)
	}
	for _, s := range []shape{
		{"native ordered", policy.Ordered, memory.Native, nothing, []int{2, 1, 1, 1}},
		{"native exclusive", policy.Exclusive, memory.Native, nothing, []int{2, 1, 1, 1}},
		{"native ordered, first acked", policy.Ordered, memory.Native, ackFirst, []int{2, 1, 1}},
		// a1 failed (its attempt is counted by the Nack); nothing behind
		// it ran under Ordered.
		{"native ordered, first nacked", policy.Ordered, memory.Native, nackFirst, []int{2, 1, 1, 1}},
		{"inprocess ordered", policy.Ordered, memory.InProcess, nothing, []int{2, 1, 1, 1}},
		{"inprocess ordered, first acked", policy.Ordered, memory.InProcess, ackFirst, []int{2, 1, 1}},
	} {
		t.Run(s.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := memory.NewBroker()
				b.CreateSubscription("t", "s", &memory.SubscriptionOptions{Ordering: s.ordering, Hold: s.hold, Chain: 3, Lease: 10 * time.Second})
				send(t, b, [2]string{"a1", "A"}, [2]string{"a2", "A"}, [2]string{"a3", "A"}, [2]string{"a4", "A"})
				ctx := context.Background()
				c1, _ := memhook.Of(b).SubscriptionDriver("s")
				got, _ := c1.Receive(ctx, 3)
				if !slices.Equal(ids(got), []string{"a1", "a2", "a3"}) {
					t.Fatalf("c1 got %v, want the chain a1 a2 a3", ids(got))
				}
				if err := s.settle(ctx, c1, got); err != nil {
					t.Fatal(err)
				}
				c1.Crash()
				time.Sleep(11 * time.Second)
				c2, _ := memhook.Of(b).SubscriptionDriver("s")
				var attempts []int
				var names []string
				for len(attempts) < len(s.want) {
					ms, err := c2.Receive(ctx, 10)
					if err != nil {
						t.Fatal(err)
					}
					for _, m := range ms {
						names = append(names, m.ID)
						attempts = append(attempts, m.Attempt)
					}
					if err := c2.Ack(ctx, ms); err != nil {
						t.Fatal(err)
					}
				}
				if !slices.Equal(attempts, s.want) {
					t.Fatalf("after the crash c2 got %v at attempts %v, want %v", names, attempts, s.want)
				}
			})
		})
	}
}
