package main

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
)

// TestOrderKept runs the program on the in-memory backend: each account's
// adjustments are applied in the order they were published, 101's retry
// before 102.
func TestOrderKept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		applied, err := run(context.Background(), "mem://comingfrom", "mem://comingfrom?subscription=apply-balance")
		if err != nil {
			t.Fatal(err)
		}
		if got := applied["acct-42"]; !slices.Equal(got, []string{"101", "102", "103"}) {
			t.Errorf("acct-42 applied %v, want 101 102 103", got)
		}
		if got := applied["acct-7"]; !slices.Equal(got, []string{"201", "202"}) {
			t.Errorf("acct-7 applied %v, want 201 202", got)
		}
	})
}
