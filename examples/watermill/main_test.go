package main

import "testing"

// TestWatermillExample runs the example on the memory backend: it fails if
// an account's history is out of order.
func TestWatermillExample(t *testing.T) {
	t.Setenv("KEYORDER_URL", "")
	if err := run(); err != nil {
		t.Fatal(err)
	}
}
