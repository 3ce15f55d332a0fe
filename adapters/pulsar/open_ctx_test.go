package pulsar_test

import (
	"testing"

	"github.com/keyorder/keyorder/integration/drivertest"
)

// TestOpenHonoursContext: publish.Open and subscribe.Open of an unreachable
// broker return when their context ends, with its error, instead of
// waiting for the client's 30-second operation timeout.
func TestOpenHonoursContext(t *testing.T) {
	base := "pulsar://" + drivertest.Unreachable(t) + "/public/default/t"
	drivertest.CheckOpenHonoursContext(t, base, base+"?subscription=s")
}
