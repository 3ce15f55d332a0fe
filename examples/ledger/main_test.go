package main

import "testing"

// TestLedger runs the demo on the memory backend: it fails if the Ordered
// history is wrong.
func TestLedger(t *testing.T) {
	t.Setenv("KEYORDER_URL", "")
	if err := run(); err != nil {
		t.Fatal(err)
	}
}
