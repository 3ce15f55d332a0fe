package postgres_test

import (
	"testing"

	"github.com/keyorder/keyorder/integration/drivertest"
)

// TestOpenHonoursContext: opening against a server that hangs returns when
// the context ends.
func TestOpenHonoursContext(t *testing.T) {
	u := "postgres://app:pw@" + drivertest.Blackhole(t) + "/db?topic=t&create=true"
	drivertest.CheckOpenHonoursContext(t, u, u+"&subscription=s")
}
