package subscribe

import (
	"fmt"
	"testing"
)

// TestIDSetRemembersTheLastN: whatever the number added, the last n IDs
// are remembered, and an ID is forgotten once 2n more have been added, so
// memory stays bounded.
func TestIDSetRemembersTheLastN(t *testing.T) {
	const n = 10
	s := newIDSet(n)
	for total := 1; total <= 5*n; total++ {
		s.add(fmt.Sprint(total))
		for k := max(1, total-n+1); k <= total; k++ {
			if !s.has(fmt.Sprint(k)) {
				t.Fatalf("after %d adds, %d (among the last %d) is forgotten", total, k, n)
			}
		}
		if k := total - 2*n; k >= 1 && s.has(fmt.Sprint(k)) {
			t.Fatalf("after %d adds, %d is still remembered", total, k)
		}
	}
	if s.has("") || newIDSet(-1).has("1") {
		t.Error("an empty ID, or a disabled set, remembers")
	}
}
