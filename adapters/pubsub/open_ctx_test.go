package pubsub_test

import (
	"testing"

	"github.com/keyorder/keyorder/integration/drivertest"
)

// TestOpenHonoursContext: opening against an emulator that hangs returns
// when the context ends.
func TestOpenHonoursContext(t *testing.T) {
	t.Setenv("PUBSUB_EMULATOR_HOST", drivertest.Blackhole(t))
	drivertest.CheckOpenHonoursContext(t, "pubsub://p/t", "pubsub://p/t?subscription=s")
}
