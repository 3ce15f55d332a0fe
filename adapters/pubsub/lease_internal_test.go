package pubsub

import (
	"testing"
	"time"
)

// TestLeaseNames: Lease sets the ack deadline, AckDeadline (its older name)
// still does, and Lease wins when both are set; both read back the value
// in force.
func TestLeaseNames(t *testing.T) {
	for _, c := range []struct {
		name string
		in   SubscriptionOptions
		want time.Duration
	}{
		{"Lease", SubscriptionOptions{Lease: 20 * time.Second}, 20 * time.Second},
		{"AckDeadline", SubscriptionOptions{AckDeadline: 40 * time.Second}, 40 * time.Second},
		{"both", SubscriptionOptions{Lease: 20 * time.Second, AckDeadline: 40 * time.Second}, 20 * time.Second},
		{"neither", SubscriptionOptions{}, AckDeadlineDefault},
		{"rounded", SubscriptionOptions{Lease: 20500 * time.Millisecond}, 21 * time.Second},
	} {
		got := c.in.withDefaults()
		if got.Lease != c.want || got.AckDeadline != c.want {
			t.Errorf("%s: Lease %v, AckDeadline %v; want both %v", c.name, got.Lease, got.AckDeadline, c.want)
		}
	}
}
