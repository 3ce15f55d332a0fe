package postgres

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/keyorder/keyorder"
)

// TestLeaseNames: Lease sets the lease, LeaseDuration (its older name)
// still does, and Lease wins when both are set; both read back the value
// in force, and a lease too short is refused naming Lease.
func TestLeaseNames(t *testing.T) {
	for _, c := range []struct {
		name string
		in   Options
		want time.Duration
	}{
		{"Lease", Options{Lease: 2 * time.Second}, 2 * time.Second},
		{"LeaseDuration", Options{LeaseDuration: 4 * time.Second}, 4 * time.Second},
		{"both", Options{Lease: 2 * time.Second, LeaseDuration: 4 * time.Second}, 2 * time.Second},
		{"neither", Options{}, LeaseDurationDefault},
	} {
		got := c.in.WithDefaults()
		if got.Lease != c.want || got.LeaseDuration != c.want {
			t.Errorf("%s: Lease %v, LeaseDuration %v; want both %v", c.name, got.Lease, got.LeaseDuration, c.want)
		}
	}
	err := (&Options{Lease: 10 * time.Millisecond}).WithDefaults().validate()
	if !errors.Is(err, keyorder.ErrInvalidConfig) || err == nil || !strings.Contains(err.Error(), "Options.Lease ") {
		t.Errorf("a 10ms Lease: %v, want ErrInvalidConfig naming Options.Lease", err)
	}
}
