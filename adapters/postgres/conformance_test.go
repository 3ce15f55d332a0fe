package postgres_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/integration/drivertest"
)

// harness runs the conformance suite on one schema of the test server: each
// case gets a fresh topic and subscription.
type harness struct {
	e     *env
	chain int
	n     atomic.Int64
}

func (h *harness) Capabilities() drivertest.Capabilities {
	c := drivertest.Capabilities{Compaction: true}
	if h.chain > 1 {
		c.Unsupported = map[string]string{
			"WorkedExample": "a claim that takes a chain (a1 with a2) prefetches the group's successor, so the " +
				"second worker waits where the worked example's broker would have handed it s1; " +
				"TestConformanceNoChains runs it with chains of one",
		}
	}
	return c
}

func (h *harness) MakePair(ctx context.Context, t *testing.T, spec drivertest.Spec) (*drivertest.Pair, error) {
	name := fmt.Sprintf("c%d", h.n.Add(1))
	opts := h.e.opts(&postgres.Options{
		Create:       true,
		Lease:        max(spec.LeaseDuration, postgres.LeaseDurationMin),
		ChainLength:  h.chain,
		Subscription: &postgres.SubscriptionOptions{Ordering: spec.Ordering, Compaction: spec.Compaction},
	})
	tp, err := postgres.OpenTopicDriver(ctx, h.e.pool, name, opts)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { tp.Close() })
	if err := h.e.admin.CreateSubscription(ctx, name, "sub", opts.Subscription); err != nil {
		return nil, err
	}
	return &drivertest.Pair{
		Topic: tp,
		OpenConsumer: func(ctx context.Context) (driver.Subscription, error) {
			s, err := postgres.OpenSubscriptionDriver(ctx, h.e.pool, name, "sub", opts)
			if err == nil {
				t.Cleanup(func() { s.Close() })
			}
			return s, err
		},
	}, nil
}

func TestConformance(t *testing.T) {
	drivertest.Run(t, &harness{e: newEnv(t), chain: postgres.ChainLengthDefault})
}

func TestConformanceNoChains(t *testing.T) {
	drivertest.Run(t, &harness{e: newEnv(t), chain: 1})
}
