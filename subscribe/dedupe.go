package subscribe

// This file: the bounded sets that suppress redeliveries of messages this
// process already settled.

import "sync"

// noteSet remembers a value for each of the last n IDs put.
type noteSet[V any] struct {
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

// idSet remembers the last n IDs added.
type idSet struct {
	mu   sync.Mutex
	ring []string
	next int
	set  map[string]struct{}
}

func newIDSet(n int) *idSet {
	if n < 0 {
		n = 0
	}
	return &idSet{ring: make([]string, n), set: make(map[string]struct{}, n)}
}

func (s *idSet) add(id string) {
	if len(s.ring) == 0 || id == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.set[id]; ok {
		return
	}
	if old := s.ring[s.next]; old != "" {
		delete(s.set, old)
	}
	s.ring[s.next] = id
	s.set[id] = struct{}{}
	s.next = (s.next + 1) % len(s.ring)
}

func (s *idSet) has(id string) bool {
	if len(s.ring) == 0 || id == "" {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.set[id]
	return ok
}
