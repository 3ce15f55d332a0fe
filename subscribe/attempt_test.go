package subscribe_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/memhook"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// ackLog records the IDs the subscriber acknowledges.
type ackLog struct {
	driver.Subscription
	mu    sync.Mutex
	acked []string
}

func (s *ackLog) Ack(ctx context.Context, ms []*driver.Message) error {
	s.mu.Lock()
	for _, m := range ms {
		s.acked = append(s.acked, m.ID)
	}
	s.mu.Unlock()
	return s.Subscription.Ack(ctx, ms)
}

// A handler's context holds its driver.Attempt: it maps the Delivery to
// the driver's message while the handler runs (and nil after), and a
// lease the driver reports lost through it is neither acknowledged nor
// otherwise settled, though the handler returns nil.
func TestAttemptMapsDeliveryAndLeaseLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered})
		raw, err := memhook.Of(w.b).SubscriptionDriver("s")
		if err != nil {
			t.Fatal(err)
		}
		drv := &ackLog{Subscription: raw}
		if driver.AttemptOf(context.Background()) != nil {
			t.Fatal("a context that is no handler's has an Attempt")
		}
		type kept struct {
			a driver.Attempt
			d *keyorder.Delivery
		}
		var mu sync.Mutex
		var after []kept
		var mismatch []string
		s, stop := w.start(t, drv, nil, func(ctx context.Context, d *keyorder.Delivery) error {
			a := driver.AttemptOf(context.WithoutCancel(ctx)) // derived contexts carry it
			if a == nil {
				mismatch = append(mismatch, d.ID+": no attempt")
				return nil
			}
			m := a.Message(d)
			copied := *d
			if m == nil || m.ID != d.ID || a.Message(&copied) != m || a.Message(&keyorder.Delivery{}) != nil {
				mismatch = append(mismatch, d.ID+": wrong message")
			}
			mu.Lock()
			after = append(after, kept{a, d})
			mu.Unlock()
			if d.ID == "lost" {
				a.LeaseLost([]*driver.Message{m})
			}
			return nil
		})
		w.publish(t, "ok", "k1")
		w.publish(t, "lost", "k2")
		synctest.Wait()
		stop()
		if len(mismatch) > 0 {
			t.Fatal(mismatch)
		}
		for _, k := range after {
			if k.a.Message(k.d) != nil {
				t.Fatalf("%s: the attempt still maps its delivery after the handler returned", k.d.ID)
			}
		}
		drv.mu.Lock()
		defer drv.mu.Unlock()
		if !slices.Equal(drv.acked, []string{"ok"}) {
			t.Fatalf("acknowledged %v, want [ok]: a lost lease must not be settled", drv.acked)
		}
		if got := counts(s).LeasesLost; got != 1 {
			t.Fatalf("LeasesLost = %d, want 1", got)
		}
	})
}

// Under RunBatch every member of the batch maps to its own message.
func TestAttemptMapsBatchMembers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &memory.SubscriptionOptions{Ordering: policy.Ordered, Chain: 3})
		var bad []string
		var mu sync.Mutex
		runs := 0
		_, stop := w.startBatch(t, &subscribe.Config{}, func(ctx context.Context, ds []*keyorder.Delivery) error {
			a := driver.AttemptOf(ctx)
			mu.Lock()
			defer mu.Unlock()
			runs++
			for _, d := range ds {
				if m := a.Message(d); m == nil || m.ID != d.ID {
					bad = append(bad, d.ID)
				}
			}
			return nil
		})
		publishAll(t, w, "k", "m1", "m2", "m3")
		synctest.Wait()
		stop()
		if runs == 0 || len(bad) > 0 {
			t.Fatalf("runs %d, unmapped %v", runs, bad)
		}
	})
}
