package subscribe

import (
	"testing"
	"unsafe"
)

// TestItemSlabSizeClass: the pump allocates items itemSlab at a time, and
// one allocation per slab is part of BenchmarkConsume's allocations per
// message; a field added to item must keep the slab within the 3,584-byte
// size class it fits today (440 bytes an item; the next class is 4,096
// bytes, 64 more a message).
func TestItemSlabSizeClass(t *testing.T) {
	if n := unsafe.Sizeof(item{}) * itemSlab; n > 3584 {
		t.Fatalf("an item slab is %d bytes (item %d × %d), over the 3584-byte size class", n, unsafe.Sizeof(item{}), itemSlab)
	}
}
