package subscribe

// KeyHolds returns how many per-key holds s keeps, for tests that check
// none is left behind.
func KeyHolds(s *Subscriber) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.holds)
}

// PeakOutstanding returns the most messages s has had outstanding
// (received and not settled) at once.
func PeakOutstanding(s *Subscriber) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak
}

// parkedKeys returns the number of keys with an item parked in process
// (not the keys a backend holds: see Subscriber.HeldKeys).
func (s *Subscriber) parkedKeys() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, h := range s.holds {
		if h.parked > 0 {
			n++
		}
	}
	return n
}

// taken returns the number of tokens taken.
func (t *tokens) taken() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.size - t.free
}
