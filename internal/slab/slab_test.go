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

func TestBytesCopiesDoNotShare(t *testing.T) {
	b := NewBytes(64)
	src := []byte("abcdef")
	c1 := b.Copy(src)
	c2 := b.Copy(src)
	src[0] = 'X'
	c1[1] = 'Y'
	c1 = append(c1, 'Z') // must not spill into c2
	if string(c2) != "abcdef" || string(c1) != "aYcdefZ" {
		t.Fatalf("copies share memory: c1 %q, c2 %q", c1, c2)
	}
	if b.Copy(nil) != nil {
		t.Fatal("Copy(nil) is not nil")
	}
	if e := b.Copy([]byte{}); e == nil || len(e) != 0 {
		t.Fatalf("Copy(empty) = %#v, want empty non-nil", e)
	}
	big := make([]byte, 17) // over a quarter of 64: alone
	if c := b.Copy(big); len(c) != 17 || cap(c) != 17 {
		t.Fatalf("large copy: len %d cap %d", len(c), cap(c))
	}
}

func TestBytesAllocatesOncePerChunk(t *testing.T) {
	b := NewBytes(64)
	p := make([]byte, 8)
	var sink []byte
	allocs := testing.AllocsPerRun(10, func() {
		for range 16 {
			sink = b.Copy(p)
		}
	})
	_ = sink
	if allocs != 2 {
		t.Fatalf("%v allocations for 16 copies of 8 bytes in chunks of 64, want 2", allocs)
	}
}
