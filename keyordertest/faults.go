package keyordertest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/subscribe"
)

// ErrInjected is the error an injected fault returns when it names none.
var ErrInjected = errors.New("keyordertest: injected failure")

// ErrTransient makes an injected publish or settlement failure retryable:
// the memory broker's drivers report an error wrapping it as transient, so
// the publisher and the subscriber retry it. Any other error is permanent.
var ErrTransient = memhook.ErrTransient

// Fault is a failure injected into a handler by FailHandler. The zero
// fields of its match part match any delivery.
type Fault struct {
	// Key, ID and Payload select deliveries by ordering key, message ID and
	// payload text; Attempt by attempt number.
	Key, ID, Payload string
	Attempt          int
	// Match, when set, must also report true.
	Match func(d *keyorder.Delivery) bool

	// Err is what the handler returns instead of running: wrap it with
	// keyorder.Permanent to dead-letter, keyorder.RetryAfter to delay.
	// Defaults to ErrInjected.
	Err error
	// Panic, when not nil, makes the handler panic with this value instead.
	Panic any
	// Times bounds how many deliveries the fault hits; 0 means every
	// matching one.
	Times int
}

func (f *Fault) matches(d *keyorder.Delivery) bool {
	return (f.Key == "" || f.Key == d.Key) && (f.ID == "" || f.ID == d.ID) &&
		(f.Payload == "" || f.Payload == string(d.Payload)) &&
		(f.Attempt == 0 || f.Attempt == d.Attempt) && (f.Match == nil || f.Match(d))
}

// FailHandler returns a middleware that fails chosen handlings: the first
// fault that matches a delivery and has hits left returns its Err (or
// panics with its Panic) instead of calling the handler; other deliveries
// run the handler. Put it after the Recorder's middleware, so the recorder
// sees the injected outcome.
func FailHandler(faults ...Fault) subscribe.Middleware {
	var mu sync.Mutex
	fs := slices.Clone(faults)
	hits := make([]int, len(fs))
	return func(next subscribe.HandlerFunc) subscribe.HandlerFunc {
		return func(ctx context.Context, d *keyorder.Delivery) error {
			mu.Lock()
			var hit *Fault
			for i := range fs {
				if (fs[i].Times == 0 || hits[i] < fs[i].Times) && fs[i].matches(d) {
					hits[i]++
					hit = &fs[i]
					break
				}
			}
			mu.Unlock()
			switch {
			case hit == nil:
				return next(ctx, d)
			case hit.Panic != nil:
				panic(hit.Panic)
			case hit.Err != nil:
				return hit.Err
			}
			return ErrInjected
		}
	}
}

// PublishFault makes sends to a memory topic fail (FailPublishes). The
// zero fields of its match part match any send.
type PublishFault struct {
	// Keys selects sends by the key of their batch (a batch holds one key).
	Keys []string
	// Calls selects sends by their number on the topic, counting from 1
	// every send since FailPublishes was called.
	Calls []int
	// Err is what the send returns. Defaults to ErrInjected, which the
	// publisher treats as permanent (the key pauses); wrap ErrTransient to
	// make it retryable.
	Err error
	// Times bounds how many sends the fault fails; 0 means every match.
	Times int
}

// FailPublishes makes sends to topic on b fail as faults say: the first
// fault that matches a send and has hits left fails it, and nothing of it
// is delivered. It replaces an earlier FailPublishes on the topic; stop
// removes it.
func FailPublishes(b *memory.Broker, topic string, faults ...PublishFault) (stop func()) {
	var mu sync.Mutex
	calls := 0
	hits := make([]int, len(faults))
	h := memhook.Of(b)
	h.FailSends(topic, func(ms []*driver.Message) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		key := ""
		if len(ms) > 0 {
			key = ms[0].Key
		}
		for i, f := range faults {
			if f.Times != 0 && hits[i] >= f.Times {
				continue
			}
			if len(f.Keys) > 0 && !slices.Contains(f.Keys, key) {
				continue
			}
			if len(f.Calls) > 0 && !slices.Contains(f.Calls, calls) {
				continue
			}
			hits[i]++
			if f.Err != nil {
				return f.Err
			}
			return ErrInjected
		}
		return nil
	})
	return func() { h.FailSends(topic, nil) }
}

// SettleOp names a settlement call a subscriber makes to the broker.
type SettleOp string

// The settlement calls FailSettlements can fail.
const (
	SettleAck          SettleOp = SettleOp(memhook.OpAck)
	SettleNack         SettleOp = SettleOp(memhook.OpNack)
	SettleRelease      SettleOp = SettleOp(memhook.OpRelease)
	SettleDeadLetter   SettleOp = SettleOp(memhook.OpDeadLetter)
	SettleExtendLeases SettleOp = SettleOp(memhook.OpExtendLeases)
)

// SettleFault makes settlement calls of a memory subscription fail
// (FailSettlements). The zero fields of its match part match any call.
type SettleFault struct {
	// Ops selects calls by operation.
	Ops []SettleOp
	// Keys selects calls by the key of one of their messages.
	Keys []string
	// Calls selects calls by their number on the subscription, counting
	// from 1 every call since FailSettlements was called.
	Calls []int
	// Err is what the call returns. Defaults to ErrInjected, which is
	// permanent; wrap ErrTransient to make it retryable.
	Err error
	// Applied makes the call take effect before Err is returned, as when
	// the broker acted but its answer was lost on the way back.
	Applied bool
	// Times bounds how many calls the fault fails; 0 means every match.
	Times int
}

// FailSettlements makes settlement calls (acknowledge, nack, release, dead
// letter, lease extension) of every consumer of the subscription subName
// on b fail as faults say: the first fault that matches a call and has
// hits left fails it. It replaces an earlier FailSettlements on the
// subscription; stop removes it. It fails when the subscription does not
// exist.
func FailSettlements(b *memory.Broker, subName string, faults ...SettleFault) (stop func(), err error) {
	var mu sync.Mutex
	calls := 0
	hits := make([]int, len(faults))
	h := memhook.Of(b)
	err = h.FailSettlements(subName, func(op memhook.Op, ms []*driver.Message) memhook.Fault {
		mu.Lock()
		defer mu.Unlock()
		calls++
		for i, f := range faults {
			if f.Times != 0 && hits[i] >= f.Times {
				continue
			}
			if len(f.Ops) > 0 && !slices.Contains(f.Ops, SettleOp(op)) {
				continue
			}
			if len(f.Keys) > 0 && !slices.ContainsFunc(ms, func(m *driver.Message) bool { return slices.Contains(f.Keys, m.Key) }) {
				continue
			}
			if len(f.Calls) > 0 && !slices.Contains(f.Calls, calls) {
				continue
			}
			hits[i]++
			if f.Err != nil {
				return memhook.Fault{Err: f.Err, Applied: f.Applied}
			}
			return memhook.Fault{Err: ErrInjected, Applied: f.Applied}
		}
		return memhook.Fault{}
	})
	if err != nil {
		return nil, err
	}
	return func() { h.FailSettlements(subName, nil) }, nil
}

// Consumer is a subscriber running on its own consumer of a memory
// subscription, as one process of an application would; Crash kills it and
// Restart starts its successor.
type Consumer struct {
	// Subscriber is the running subscriber.
	Subscriber *subscribe.Subscriber

	tb      testing.TB
	b       *memory.Broker
	subName string
	cfg     *subscribe.Config
	h       subscribe.HandlerFunc
	drv     memhook.Subscription
	done    chan error
	once    sync.Once
	crashed bool
}

// StartConsumer opens a new consumer of the subscription subName on b and
// runs a subscribe.Subscriber with cfg and h on it in the background. The
// consumer is stopped gracefully when the test ends, if it is still
// running. A failure to start fails the test.
func StartConsumer(tb testing.TB, b *memory.Broker, subName string, cfg *subscribe.Config, h subscribe.HandlerFunc) *Consumer {
	tb.Helper()
	drv, err := memhook.Of(b).SubscriptionDriver(subName)
	if err != nil {
		tb.Fatalf("keyordertest: open consumer of %q: %v", subName, err)
	}
	sub, err := subscribe.New(drv, cfg)
	if err != nil {
		tb.Fatalf("keyordertest: subscribe.New: %v", err)
	}
	c := &Consumer{Subscriber: sub, tb: tb, b: b, subName: subName, cfg: cfg, h: h, drv: drv, done: make(chan error, 1)}
	go func() { c.done <- sub.Run(context.Background(), h) }()
	tb.Cleanup(c.Stop)
	return c
}

// Stop shuts the subscriber down gracefully (it returns what it has not
// started to the broker) and waits for it. It does nothing after Crash or
// a first Stop.
func (c *Consumer) Stop() {
	c.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Subscriber.Close(ctx); err != nil {
			c.tb.Errorf("keyordertest: Close: %v", err)
		}
		if err := <-c.done; err != nil {
			c.tb.Errorf("keyordertest: Run: %v", err)
		}
	})
}

// Crash kills the consumer as a process dies: from now on nothing it does
// reaches the broker. Handlers already running
// finish, but what they return is never settled; every message the
// consumer held is redelivered when its lease expires (the subscription's
// lease duration), counting an attempt. Crash returns when the subscriber
// has stopped.
func (c *Consumer) Crash() {
	c.once.Do(func() {
		c.crashed = true
		c.drv.Crash()
		if err := <-c.done; err != nil && !errors.Is(err, memhook.ErrCrashed) {
			c.tb.Errorf("keyordertest: Run after Crash: %v", err)
		}
		c.Subscriber.Close(context.Background())
	})
}

// Restart starts a new consumer with the same subscription, configuration
// and handler, as the process's replacement would be: it shares nothing
// with this one (in particular not the memory of acknowledged IDs). This
// consumer is crashed first if it is still running.
func (c *Consumer) Restart() *Consumer {
	c.tb.Helper()
	c.Crash()
	return StartConsumer(c.tb, c.b, c.subName, c.cfg, c.h)
}

// DeadLetterIDs returns the IDs of every dead letter of the subscriber's
// subscription, for Spec.DeadLettered: messages the subscriber dead-letters
// without calling the handler (their attempts used up by lost leases) are
// resolved only there.
func DeadLetterIDs(ctx context.Context, sub *subscribe.Subscriber) ([]string, error) {
	dls, err := sub.DeadLetters(ctx, 0) // 0 lists them all
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(dls))
	for _, d := range dls {
		ids = append(ids, d.Message.ID)
	}
	return ids, nil
}
