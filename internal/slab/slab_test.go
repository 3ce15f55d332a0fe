package slab

import "testing"

func TestNextHandsOutDistinctZeroValues(t *testing.T) {
	s := New[[2]int](4)
	seen := map[*[2]int]bool{}
	for range 9 {
		v := s.Next()
		if *v != [2]int{} {
			t.Fatalf("value not zero: %v", *v)
		}
		if seen[v] {
			t.Fatal("the same value handed out twice")
		}
		seen[v] = true
		v[0] = 1 // a later Next must not see this
	}
}

func TestNextAllocatesOncePerSlab(t *testing.T) {
	s := New[[2]int](4)
	var sink *[2]int
	allocs := testing.AllocsPerRun(10, func() {
		for range 8 {
			sink = s.Next()
		}
	})
	_ = sink
	if allocs != 2 {
		t.Fatalf("%v allocations for 8 values in slabs of 4, want 2", allocs)
	}
}

func TestNewClampsSize(t *testing.T) {
	s := New[int](0)
	a, b := s.Next(), s.Next()
	if a == b {
		t.Fatal("size 0 must behave as 1, handing out distinct values")
	}
}
