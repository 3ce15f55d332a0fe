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
