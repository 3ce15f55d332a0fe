package subscribe

import (
	"runtime"
	"testing"
	"unsafe"

	"github.com/keyorder/keyorder/internal/slab"
)

// TestItemSlabSizeClass: the pump allocates items itemSlab at a time, and
// the bytes a slab takes are most of BenchmarkConsume's bytes per message
// (and of the garbage collector's work). The allocator rounds a slab up to
// its size class; the slab must fill it to within one item, so that no
// room an item would fit in is wasted. (With 448-byte items and 8 a slab,
// 3,584 bytes took a 4,096-byte class: 512 bytes a message, 64 of them
// waste; 9 a slab take 455.)
func TestItemSlabSizeClass(t *testing.T) {
	const slabs = 10000
	s := slab.New[item](itemSlab)
	keep := make([]*item, 0, slabs*itemSlab)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range slabs * itemSlab {
		keep = append(keep, s.Next())
	}
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(keep)
	class := (after.TotalAlloc - before.TotalAlloc) / slabs
	size := uint64(unsafe.Sizeof(item{}))
	if used := size * itemSlab; class-used >= size {
		t.Fatalf("an item slab takes %d bytes for %d items of %d (%d): %d bytes, room for %d more item(s), wasted; make itemSlab %d",
			class, itemSlab, size, used, class-used, (class-used)/size, class/size)
	}
	t.Logf("item %d bytes, %d a slab: %d bytes of a %d-byte class, %d bytes a message", size, itemSlab, size*itemSlab, class, class/itemSlab)
}
