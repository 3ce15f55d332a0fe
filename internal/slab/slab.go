// Package slab hands out zero values of a type allocated several at a
// time, for hot paths that create one small object per message.
//
// A slab is never reused: each value lives as long as anything reaches it,
// as if allocated alone. The price is memory, not safety: the garbage
// collector frees a slab's backing array only when none of its values is
// reachable, so one long-lived value keeps its slab's other values (and
// what they point to) alive with it. Keep slabs small where values can be
// retained by users.
package slab

// Slab allocates values of T several at a time (New's size). The zero Slab
// allocates them one at a time. A Slab is not safe for concurrent use: keep
// it where one goroutine (or one lock) owns it.
type Slab[T any] struct {
	size int
	free []T
}

// New returns a Slab that allocates size values at a time (at least 1).
func New[T any](size int) Slab[T] {
	return Slab[T]{size: max(size, 1)}
}

// Next returns a pointer to a zero T from the current slab, allocating a
// new slab when it is used up.
func (s *Slab[T]) Next() *T {
	if len(s.free) == 0 {
		s.free = make([]T, max(s.size, 1))
	}
	v := &s.free[0]
	s.free = s.free[1:]
	return v
}

// Bytes cuts copies of byte slices from chunks allocated several at a time
// (NewBytes's size), for hot paths that copy one small payload per message.
// The same price as Slab's applies: a chunk lives until none of the copies
// cut from it is reachable. A copy larger than a quarter of a chunk is
// allocated alone. The zero Bytes allocates every copy alone. A Bytes is
// not safe for concurrent use.
type Bytes struct {
	size int
	free []byte
}

// NewBytes returns a Bytes that allocates size bytes at a time.
func NewBytes(size int) Bytes {
	return Bytes{size: max(size, 0)}
}

// Copy returns a copy of p that shares no memory with p or with any other
// copy: its capacity is its length, so appending to it reallocates. A nil
// p gives nil and an empty one an empty non-nil slice, without allocating.
func (b *Bytes) Copy(p []byte) []byte {
	if p == nil {
		return nil
	}
	if len(p) == 0 {
		return []byte{}
	}
	c := b.Cut(len(p))
	copy(c, p)
	return c
}

// Cut returns n zero bytes (nil for n <= 0) that share no memory with
// anything cut before: their capacity is n.
func (b *Bytes) Cut(n int) []byte {
	if n <= 0 {
		return nil
	}
	if n > b.size/4 {
		return make([]byte, n)
	}
	if len(b.free) < n {
		b.free = make([]byte, b.size)
	}
	c := b.free[:n:n]
	b.free = b.free[n:]
	return c
}
