package sqs

import (
	"testing"
	"time"
)

// TestLeaseNames: Lease sets the visibility timeout, Visibility (its older
// name) still does, and Lease wins when both are set; both read back the
// value in force.
func TestLeaseNames(t *testing.T) {
	for _, c := range []struct {
		name string
		in   Options
		want time.Duration
	}{
		{"Lease", Options{Lease: 20 * time.Second}, 20 * time.Second},
		{"Visibility", Options{Visibility: 40 * time.Second}, 40 * time.Second},
		{"both", Options{Lease: 20 * time.Second, Visibility: 40 * time.Second}, 20 * time.Second},
		{"neither", Options{}, VisibilityDefault},
		{"rounded", Options{Lease: 1500 * time.Millisecond}, 2 * time.Second},
	} {
		got := c.in.withDefaults()
		if got.Lease != c.want || got.Visibility != c.want {
			t.Errorf("%s: Lease %v, Visibility %v; want both %v", c.name, got.Lease, got.Visibility, c.want)
		}
	}
}
