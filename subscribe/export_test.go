package subscribe

// KeyHolds returns how many per-key holds s keeps, for tests that check
// none is left behind.
func KeyHolds(s *Subscriber) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.holds)
}
