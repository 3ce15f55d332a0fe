package postgres_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters/postgres"
	"github.com/keyorder/keyorder/policy"
)

// Out-of-range enums in Options are rejected before any connection is
// used, naming the field.
func TestOptionsRejectUnknownEnums(t *testing.T) {
	for field, o := range map[string]*postgres.Options{
		"MissingKey": {MissingKey: policy.MissingKey(99)},
		"Ordering":   {Subscription: &postgres.SubscriptionOptions{Ordering: policy.Ordering(-1)}},
	} {
		if _, err := postgres.NewAdmin(nil, o); !errors.Is(err, keyorder.ErrInvalidConfig) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s out of range: %v, want ErrInvalidConfig naming it", field, err)
		}
	}
}

// TestStoredOrderingNumbers: the subscriptions table keeps the numbers its
// SQL reads (0 parallel, 1 exclusive, 2 ordered) whatever policy.Ordering's
// constants are; the zero SubscriptionOptions store Ordered; reopening with
// the same ordering succeeds and with another fails.
func TestStoredOrderingNumbers(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t, 30*time.Second)
	for _, c := range []struct {
		name string
		opts *postgres.SubscriptionOptions
		want int16
		back policy.Ordering
	}{
		{"zero", &postgres.SubscriptionOptions{}, 2, policy.Ordered},
		{"nil", nil, 2, policy.Ordered},
		{"parallel", &postgres.SubscriptionOptions{Ordering: policy.Parallel}, 0, policy.Parallel},
		{"exclusive", &postgres.SubscriptionOptions{Ordering: policy.Exclusive}, 1, policy.Exclusive},
		{"ordered", &postgres.SubscriptionOptions{Ordering: policy.Ordered}, 2, policy.Ordered},
	} {
		if err := e.admin.CreateSubscription(ctx, "t", c.name, c.opts); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var n int16
		if err := e.pool.QueryRow(ctx, "SELECT ordering FROM "+e.schema+".subscriptions WHERE name = $1", c.name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != c.want {
			t.Errorf("%s: stored ordering %d, want %d", c.name, n, c.want)
		}
		o := e.opts(nil)
		o.Subscription = &postgres.SubscriptionOptions{Ordering: c.back}
		s, err := postgres.OpenSubscriptionDriver(ctx, e.pool, "t", c.name, o)
		if err != nil {
			t.Fatalf("%s: reopen as %v: %v", c.name, c.back, err)
		}
		if got := s.Capabilities().Ordering; got != c.back {
			t.Errorf("%s: capabilities ordering %v, want %v", c.name, got, c.back)
		}
		s.Close()
		other := policy.Parallel
		if c.back == policy.Parallel {
			other = policy.Ordered
		}
		if err := e.admin.CreateSubscription(ctx, "t", c.name, &postgres.SubscriptionOptions{Ordering: other}); !errors.Is(err, keyorder.ErrInvalidConfig) {
			t.Errorf("%s: recreate as %v: %v, want ErrInvalidConfig", c.name, other, err)
		}
	}
}
