package sqs_test

import (
	"testing"

	"github.com/keyorder/keyorder/integration/drivertest"
)

// TestOpenHonoursContext: opening against an endpoint that hangs returns
// when the context ends.
func TestOpenHonoursContext(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	u := "sqs://q.fifo?region=us-east-1&endpoint=http://" + drivertest.Blackhole(t)
	drivertest.CheckOpenHonoursContext(t, u, u)
}
