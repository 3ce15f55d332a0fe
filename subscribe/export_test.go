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
