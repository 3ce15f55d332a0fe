package kafka_test

import (
	"testing"

	"github.com/keyorder/keyorder/integration/drivertest"
)

// TestOpenHonoursContext: publish.Open and subscribe.Open of an unreachable
// or hanging broker return when their context ends, with its error,
// instead of waiting for the opener's 30-second connect bound.
func TestOpenHonoursContext(t *testing.T) {
	for _, addr := range []string{drivertest.Unreachable(t), drivertest.Blackhole(t)} {
		base := "kafka://" + addr + "/t"
		drivertest.CheckOpenHonoursContext(t, base, base+"?group=g")
	}
}
