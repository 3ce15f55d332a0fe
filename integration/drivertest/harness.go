// Package drivertest is keyorder's contract: one conformance suite that
// every backend runs unchanged against its real broker (gocloud.dev names
// its suite the same way). The launcher that starts those brokers for the
// test command lives beside it in integration/.
//
// A backend provides a Harness and calls Run from a conformance_test.go.
// Each case of the suite states one rule of the guarantee in DESIGN.md and
// checks it through the portable publish and subscribe packages, so what is
// proven is what users get. A backend that cannot support a case declares it
// in Capabilities.Unsupported with the reason; the suite reports each such
// case as skipped with that reason, never silently.
package drivertest

import (
	"context"
	"testing"
	"time"

	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// Spec describes the subscription a case needs.
type Spec struct {
	// Ordering is the subscription's policy.
	Ordering policy.Ordering
	// LeaseDuration is the lease the case wants (the lost-consumer case
	// waits for it to expire). A backend may round it up to its minimum and
	// must report what it used in the driver's Capabilities.
	LeaseDuration time.Duration
	// Compaction asks for a subscription that delivers, per key, only the
	// newest message waiting when the key becomes free (the rest are
	// superseded). A backend without compaction declares the cases that set
	// it Unsupported.
	Compaction bool
}

// Pair is a fresh topic with one subscription on it.
type Pair struct {
	// Topic publishes to the topic.
	Topic driver.Topic
	// OpenConsumer opens a new consumer of the subscription, as a separate
	// process would; each call returns a separate driver.
	OpenConsumer func(ctx context.Context) (driver.Subscription, error)
}

// Capabilities declare how a backend runs the suite.
type Capabilities struct {
	// FakeClock: the backend runs entirely in process, so each case runs
	// inside a testing/synctest bubble with a fake clock and the worked
	// example is checked step by step against its exact schedule.
	FakeClock bool
	// Unit is the time unit delays are scaled to (the worked example's
	// "retry after 5s" becomes 5 units). Defaults to one second under
	// FakeClock and 250ms otherwise.
	Unit time.Duration
	// Unsupported maps case names to the reason the backend cannot run them.
	Unsupported map[string]string
	// Compaction: the backend can create subscriptions with Spec.Compaction.
	// Without it the harness must declare the cases that need compaction
	// in Unsupported, with its reason.
	Compaction bool
}

// Harness creates topics and subscriptions on one backend.
type Harness interface {
	// Capabilities declare how the backend runs the suite.
	Capabilities() Capabilities
	// MakePair creates a fresh topic and subscription per spec, registering
	// their cleanup with t.Cleanup. Under FakeClock it is called inside the
	// case's synctest bubble.
	MakePair(ctx context.Context, t *testing.T, spec Spec) (*Pair, error)
}
