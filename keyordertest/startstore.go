package keyordertest

import (
	"context"
	"sync"

	"github.com/keyorder/keyorder/driver"
)

// StartStore is an in-memory driver.StartStore for tests: the SQS and
// Pub/Sub drivers take one (their StartStore option) to count a crash only
// against messages whose handler started. It holds one process's records,
// so it stands in for a shared store only while every consumer of the
// subscription runs in the test's process; use the PostgreSQL adapter's
// (postgres.NewStartStore) across processes. Fail makes its calls fail, to
// test what a driver does while its store is down.
type StartStore struct {
	mu    sync.Mutex
	runs  map[[2]string]int
	err   error
	calls int
}

var _ driver.StartStore = (*StartStore)(nil)

// NewStartStore returns an empty in-memory start store.
func NewStartStore() *StartStore { return &StartStore{runs: map[[2]string]int{}} }

// Fail makes every later call return err (nil: succeed again).
func (s *StartStore) Fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
}

// Calls returns how many calls the store has answered, failed ones
// included.
func (s *StartStore) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// Len returns how many records the store holds.
func (s *StartStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.runs)
}

// Runs implements driver.StartStore.
func (s *StartStore) Runs(ctx context.Context, sub string, ids []string) (map[string]int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.err != nil {
		return nil, s.err
	}
	out := map[string]int{}
	for _, id := range ids {
		if n, ok := s.runs[[2]string{sub, id}]; ok {
			out[id] = n
		}
	}
	return out, nil
}

// Record implements driver.StartStore.
func (s *StartStore) Record(ctx context.Context, sub string, runs map[string]int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.err != nil {
		return s.err
	}
	for id, n := range runs {
		k := [2]string{sub, id}
		s.runs[k] = max(s.runs[k], n)
	}
	return nil
}

// Forget implements driver.StartStore.
func (s *StartStore) Forget(ctx context.Context, sub string, ids []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.err != nil {
		return s.err
	}
	for _, id := range ids {
		delete(s.runs, [2]string{sub, id})
	}
	return nil
}
