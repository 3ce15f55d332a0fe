package subscribe

import (
	"context"
	"testing"

	"github.com/keyorder/keyorder/driver"
)

// TestKeyHoldIsTheOneOwner: each key's hold owns its outstanding items and
// its parked count. Parking a key frees the tokens of that key's items
// only (walking the key's own list, never the other keys' items); the hold
// goes when nothing of the key is outstanding or parked, and is reused.
func TestKeyHoldIsTheOneOwner(t *testing.T) {
	s := &Subscriber{
		holdKeys: true,
		holds:    map[string]*keyHold{},
		tokens:   newTokens(100),
	}
	add := func(id, key string) *item {
		it := &item{m: &driver.Message{ID: id, Key: key}, key: key, hasToken: true}
		if n, err := s.tokens.acquire(context.Background(), 1); n != 1 || err != nil {
			t.Fatalf("acquire: %d, %v", n, err)
		}
		s.mu.Lock()
		s.addOutstanding(it)
		s.mu.Unlock()
		return it
	}
	a1, a2, a3 := add("a1", "A"), add("a2", "A"), add("a3", "A")
	var bs []*item
	for range 50 {
		bs = append(bs, add("b", "B"))
	}
	free := add("s1", "")
	if got := len(s.holds); got != 2 {
		t.Fatalf("%d holds, want 2 (keyless items have none)", got)
	}
	if h := s.holds["A"]; h.n != 3 || h.head != a1 || h.tail != a3 || a2.prevK != a1 || a2.nextK != a3 {
		t.Fatalf("key A's hold does not list a1, a2, a3 in order")
	}

	s.park(a1)
	if a1.hasToken || a2.hasToken || a3.hasToken {
		t.Errorf("parking a1 left a token with a key A item")
	}
	for _, b := range bs {
		if !b.hasToken {
			t.Fatalf("parking key A took a token from a key B item")
		}
	}
	if !free.hasToken {
		t.Errorf("parking key A took a keyless item's token")
	}
	if got := s.tokens.taken(); got != 51 {
		t.Errorf("%d tokens held after parking A, want 51 (B's 50 and s1)", got)
	}
	if got := s.parkedKeys(); got != 1 {
		t.Errorf("heldKeys = %d, want 1", got)
	}

	// a2 and a3 finish while a1 is parked, then a1 itself (lost while
	// parked: out of outstanding first, unparked after).
	s.forget(a2)
	s.forget(a3)
	s.forget(a1)
	if h := s.holds["A"]; h == nil || h.parked != 1 || h.n != 0 {
		t.Fatalf("key A's hold went while a1 was still parked")
	}
	s.unpark(a1)
	if _, ok := s.holds["A"]; ok {
		t.Errorf("key A's hold stayed with nothing outstanding or parked")
	}
	if len(s.holdsSpare) != 1 {
		t.Errorf("%d spare holds, want 1 (A's, for reuse)", len(s.holdsSpare))
	}
	s.forget(a1) // idempotent
	for _, b := range bs {
		s.forget(b)
	}
	s.forget(free)
	if len(s.holds) != 0 || s.outstanding.n != 0 || s.tokens.taken() != 0 || s.parkedKeys() != 0 {
		t.Errorf("left: %d holds, %d outstanding, %d tokens", len(s.holds), s.outstanding.n, s.tokens.taken())
	}
}
