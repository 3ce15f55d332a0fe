package subscribe

// This file: the bounded sets that suppress redeliveries of messages this
// process already settled.

import (
	"sync"
	"sync/atomic"
)

// noteSet remembers a value for each of the last n IDs put.
type noteSet[V any] struct {
	// used is set by the first put: until then get answers without the
	// lock (most subscribers dead-letter nothing, and get runs for every
	// message).
	used atomic.Bool
	mu   sync.Mutex
	ring []string
	next int
	m    map[string]V
}

func newNoteSet[V any](n int) *noteSet[V] {
	return &noteSet[V]{ring: make([]string, max(n, 0)), m: map[string]V{}}
}

func (s *noteSet[V]) put(id string, v V) {
	if len(s.ring) == 0 || id == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.used.Store(true)
	if _, ok := s.m[id]; !ok {
		if old := s.ring[s.next]; old != "" {
			delete(s.m, old)
		}
		s.ring[s.next] = id
		s.next = (s.next + 1) % len(s.ring)
	}
	s.m[id] = v
}

func (s *noteSet[V]) get(id string) (V, bool) {
	if !s.used.Load() {
		var zero V
		return zero, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[id]
	return v, ok
}

// remove forgets id's value; its ring slot is reused in turn.
func (s *noteSet[V]) remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
}

// idSet remembers the last n IDs added, and up to n before them: IDs go
// into cur, and when cur holds n it becomes prev, the old prev emptied to
// be the next cur. An add is one map insert, where a ring of the last n
// would also delete the oldest ID from a map of n (a cache miss per
// acknowledged message); clearing a full map costs about as much per ID,
// but in one sweep.
type idSet struct {
	// used is set by the first add: until then has answers without the
	// lock (over a driver whose acknowledgements are final, only a failed
	// Ack adds).
	used      atomic.Bool
	mu        sync.Mutex
	n         int
	cur, prev map[string]struct{}
}

func newIDSet(n int) *idSet {
	if n < 0 {
		n = 0
	}
	return &idSet{n: n, cur: map[string]struct{}{}, prev: map[string]struct{}{}}
}

func (s *idSet) add(id string) {
	if s.n == 0 || id == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.used.Load() {
		s.used.Store(true)
	}
	if _, ok := s.cur[id]; ok {
		return
	}
	s.cur[id] = struct{}{}
	if len(s.cur) >= s.n {
		s.cur, s.prev = s.prev, s.cur
		clear(s.cur)
	}
}

func (s *idSet) has(id string) bool {
	if s.n == 0 || id == "" || !s.used.Load() {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.cur[id]; ok {
		return true
	}
	_, ok := s.prev[id]
	return ok
}
