package memory

import (
	"testing"
	"time"
)

// TestLeaseNames: Lease sets the lease, LeaseDuration (its older name)
// still does, and Lease wins when both are set; both read back the value
// in force.
func TestLeaseNames(t *testing.T) {
	for _, c := range []struct {
		name string
		in   SubscriptionOptions
		want time.Duration
	}{
		{"Lease", SubscriptionOptions{Lease: 2 * time.Second}, 2 * time.Second},
		{"LeaseDuration", SubscriptionOptions{LeaseDuration: 4 * time.Second}, 4 * time.Second},
		{"both", SubscriptionOptions{Lease: 2 * time.Second, LeaseDuration: 4 * time.Second}, 2 * time.Second},
		{"neither", SubscriptionOptions{}, LeaseDurationDefault},
	} {
		got := c.in.withDefaults()
		if got.Lease != c.want || got.LeaseDuration != c.want {
			t.Errorf("%s: Lease %v, LeaseDuration %v; want both %v", c.name, got.Lease, got.LeaseDuration, c.want)
		}
	}
}
