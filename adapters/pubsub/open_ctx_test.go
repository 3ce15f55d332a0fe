package pubsub_test

import (
	"testing"

	"github.com/keyorder/keyorder/internal/opentest"
)

// TestOpenHonoursContext: opening against an emulator that hangs returns
// when the context ends.
func TestOpenHonoursContext(t *testing.T) {
	t.Setenv("PUBSUB_EMULATOR_HOST", opentest.Blackhole(t))
	opentest.CheckOpenHonoursContext(t, "pubsub://p/t", "pubsub://p/t?subscription=s")
}
