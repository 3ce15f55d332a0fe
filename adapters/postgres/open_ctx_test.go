package postgres_test

import (
	"testing"

	"github.com/keyorder/keyorder/internal/opentest"
)

// TestOpenHonoursContext: opening against a server that hangs returns when
// the context ends.
func TestOpenHonoursContext(t *testing.T) {
	u := "postgres://app:pw@" + opentest.Blackhole(t) + "/db?topic=t&create=true"
	opentest.CheckOpenHonoursContext(t, u, u+"&subscription=s")
}
