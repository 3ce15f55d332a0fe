package subscribe

import (
	"testing"
	"unsafe"
)

// TestItemSlabSizeClass: the pump allocates items itemSlab at a time, and
// one allocation per slab is part of BenchmarkConsume's allocations per
// message; a field added to item must keep the slab within the 3,072-byte
// size class it fits today (the next class, 3,200 bytes, wastes 128 bytes
// a slab; past it the slab costs more per message).
func TestItemSlabSizeClass(t *testing.T) {
	if n := unsafe.Sizeof(item{}) * itemSlab; n > 3072 {
		t.Fatalf("an item slab is %d bytes (item %d × %d), over the 3072-byte size class", n, unsafe.Sizeof(item{}), itemSlab)
	}
}
