package nats_test

import (
	"testing"

	"github.com/keyorder/keyorder/integration/drivertest"
)

// TestOpenHonoursContext: publish.Open and subscribe.Open of an unreachable
// or hanging server return when their context ends, with its error.
func TestOpenHonoursContext(t *testing.T) {
	for _, addr := range []string{drivertest.Unreachable(t), drivertest.Blackhole(t)} {
		base := "nats://" + addr + "/S"
		drivertest.CheckOpenHonoursContext(t, base, base+"?subscription=s")
	}
}
