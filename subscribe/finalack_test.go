package subscribe_test

import (
	"context"
	"errors"
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
)

// finalAcks declares the memory driver's acknowledgements final
// (driver.FinalAcker), as PostgreSQL's are, and fails the first failAcks
// Ack calls without passing them on, as an Ack that did not land.
type finalAcks struct {
	driver.Subscription
	mu       sync.Mutex
	failAcks int
	passed   atomic.Int32 // messages whose Ack was passed on
}

func (f *finalAcks) AcksFinal() bool { return true }

func (f *finalAcks) Ack(ctx context.Context, ms []*driver.Message) error {
	f.mu.Lock()
	fail := f.failAcks > 0
	if fail {
		f.failAcks--
	}
	f.mu.Unlock()
	if fail {
		return errors.New("ack lost")
	}
	f.passed.Add(int32(len(ms)))
	return f.Subscription.Ack(ctx, ms)
}

// Over a driver whose acknowledgements are final the subscriber remembers
// no acknowledged ID: a second message published with an ID it acknowledged
// runs (TestRedeliveryOfAckedIDIsSuppressed is the same over a driver that
// does not say so: suppressed).
func TestFinalAcksRememberNoAckedID(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered})
		raw, err := memhook.Of(w.b).SubscriptionDriver("s")
		if err != nil {
			t.Fatal(err)
		}
		var calls atomic.Int32
		s, stop := w.start(t, &finalAcks{Subscription: raw}, nil, func(ctx context.Context, d *keyorder.Delivery) error {
			calls.Add(1)
			return nil
		})
		w.publish(t, "same-id", "k")
		synctest.Wait()
		w.publish(t, "same-id", "k")
		synctest.Wait()
		stop()
		if calls.Load() != 2 || counts(s).Suppressed != 0 {
			t.Fatalf("handler calls = %d, suppressed = %d; want 2 and 0", calls.Load(), counts(s).Suppressed)
		}
	})
}

// Over a driver whose acknowledgements are final, a message whose Ack
// failed is remembered: when its lease runs out and the broker delivers it
// again, it is acknowledged without running a second time.
func TestFinalAcksRememberFailedAck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Lease: 9 * time.Second})
		raw, err := memhook.Of(w.b).SubscriptionDriver("s")
		if err != nil {
			t.Fatal(err)
		}
		var calls atomic.Int32
		drv := &finalAcks{Subscription: raw, failAcks: 1}
		s, stop := w.start(t, drv, nil, func(ctx context.Context, d *keyorder.Delivery) error {
			calls.Add(1)
			return nil
		})
		stop = stopOnce(stop)
		defer stop()
		w.publish(t, "m1", "k")
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		st := counts(s)
		if calls.Load() != 1 || st.Suppressed != 1 || st.SettleFailures != 1 {
			t.Fatalf("handler calls = %d, suppressed = %d, settle failures = %d; want 1, 1 and 1", calls.Load(), st.Suppressed, st.SettleFailures)
		}
		if n := drv.passed.Load(); n != 1 {
			t.Fatalf("%d acknowledgements reached the broker; want 1 (the redelivery's)", n)
		}
	})
}
