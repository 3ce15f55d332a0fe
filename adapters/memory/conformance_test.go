package memory_test

import (
	"context"
	"maps"
	"testing"

	"github.com/keyorder/keyorder/adapters/memory"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/integration/drivertest"
	"github.com/keyorder/keyorder/internal/memhook"
)

type harness struct {
	hold  memory.Hold
	chain int
}

func (h harness) Capabilities() drivertest.Capabilities {
	c := drivertest.Capabilities{FakeClock: true, Unsupported: map[string]string{
		"CompactionDeliversNewest": "the memory broker has no compaction: its key queues (internal/groupq) hand out " +
			"every message; compaction is PostgreSQL's (SubscriptionOptions.Compaction)",
	}}
	if h.chain > 1 {
		maps.Copy(c.Unsupported, map[string]string{
			"WorkedExample": "a receive that returns a chain (a1 with a2) prefetches the group's successor, so the " +
				"second worker waits where the worked example's broker would have handed it s1; " +
				"chains trade that exact schedule for fewer round trips (group order is still checked by the other cases)",
		})
	}
	return c
}

func (h harness) MakePair(ctx context.Context, t *testing.T, spec drivertest.Spec) (*drivertest.Pair, error) {
	b := memory.NewBroker()
	if err := b.CreateSubscription("topic", "sub", &memory.SubscriptionOptions{
		Ordering: spec.Ordering, Hold: h.hold, Lease: spec.LeaseDuration, Chain: h.chain,
	}); err != nil {
		return nil, err
	}
	return &drivertest.Pair{
		Topic: memhook.Of(b).TopicDriver("topic"),
		OpenConsumer: func(ctx context.Context) (driver.Subscription, error) {
			return memhook.Of(b).SubscriptionDriver("sub")
		},
	}, nil
}

func TestConformanceNative(t *testing.T)    { drivertest.Run(t, harness{hold: memory.Native}) }
func TestConformanceChains(t *testing.T)    { drivertest.Run(t, harness{hold: memory.Native, chain: 4}) }
func TestConformanceInProcess(t *testing.T) { drivertest.Run(t, harness{hold: memory.InProcess}) }
