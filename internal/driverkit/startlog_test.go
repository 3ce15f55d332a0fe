package driverkit_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/keyorder/keyorder/internal/driverkit"
)

// fakeStore is a driver.StartStore in memory that counts its calls.
type fakeStore struct {
	mu      sync.Mutex
	runs    map[string]int
	err     error
	records int
	reads   int
	forgets int
}

func (s *fakeStore) Runs(_ context.Context, _ string, ids []string) (map[string]int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	if s.err != nil {
		return nil, s.err
	}
	out := map[string]int{}
	for _, id := range ids {
		if n, ok := s.runs[id]; ok {
			out[id] = n
		}
	}
	return out, nil
}

func (s *fakeStore) Record(_ context.Context, _ string, runs map[string]int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.records++
	if s.err != nil {
		return s.err
	}
	for id, n := range runs {
		s.runs[id] = max(s.runs[id], n)
	}
	return nil
}

func (s *fakeStore) Forget(_ context.Context, _ string, ids []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgets++
	for _, id := range ids {
		delete(s.runs, id)
	}
	return nil
}

func (s *fakeStore) get(id string) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.runs[id]
	return n, ok
}

// A first delivery reads nothing; its start is written by the writer (here
// at Close), not by Started; a message settled before the write costs no
// write at all.
func TestStartLogLazy(t *testing.T) {
	st := &fakeStore{runs: map[string]int{}}
	l := driverkit.NewStartLog(st, "q", nil, time.Hour) // writes at Close
	a, b := &driverkit.StartMark{ID: "a"}, &driverkit.StartMark{ID: "b"}
	if err := l.Resolve(t.Context(), []*driverkit.StartMark{a, b}); err != nil {
		t.Fatal(err)
	}
	if st.reads != 0 {
		t.Fatalf("first deliveries read the store %d times, want 0", st.reads)
	}
	if err := l.Started(t.Context(), []*driverkit.StartMark{a, b}); err != nil {
		t.Fatal(err)
	}
	l.Settled([]*driverkit.StartMark{b})
	l.Close()
	if n, _ := st.get("a"); n != 1 {
		t.Errorf("a: %d runs recorded, want 1", n)
	}
	if _, ok := st.get("b"); ok {
		t.Error("b was settled before its write, and was recorded")
	}
}

// A message whose earlier deliveries outnumber its recorded runs is
// suspect: Started records it before returning. One whose runs explain
// them is not.
func TestStartLogSuspectRecordsAtOnce(t *testing.T) {
	st := &fakeStore{runs: map[string]int{"p": 1, "ok": 2}}
	l := driverkit.NewStartLog(st, "q", nil, time.Hour) // lazy writes at Close
	defer l.Close()
	p := &driverkit.StartMark{ID: "p", Earlier: 2}
	ok := &driverkit.StartMark{ID: "ok", Earlier: 2}
	if err := l.Resolve(t.Context(), []*driverkit.StartMark{p, ok}); err != nil {
		t.Fatal(err)
	}
	if p.Runs() != 1 || !p.Suspect() || ok.Runs() != 2 || ok.Suspect() {
		t.Fatalf("p: %d runs, suspect %v; ok: %d runs, suspect %v", p.Runs(), p.Suspect(), ok.Runs(), ok.Suspect())
	}
	if err := l.Started(t.Context(), []*driverkit.StartMark{p}); err != nil {
		t.Fatal(err)
	}
	if n, _ := st.get("p"); n != 2 {
		t.Errorf("p: %d runs recorded when Started returned, want 2", n)
	}
	if err := l.Started(t.Context(), []*driverkit.StartMark{ok}); err != nil {
		t.Fatal(err)
	}
	if n, _ := st.get("ok"); n != 2 {
		t.Errorf("ok: %d runs recorded when Started returned, want 2 (its write is lazy)", n)
	}
	// Flush (a nack) writes it now.
	if err := l.Flush(t.Context(), []*driverkit.StartMark{ok}); err != nil {
		t.Fatal(err)
	}
	if n, _ := st.get("ok"); n != 3 {
		t.Errorf("ok: %d runs recorded after Flush, want 3", n)
	}
	// Settling a recorded message deletes its record (at the next write).
	l.Settled([]*driverkit.StartMark{ok})
	l.Close()
	if _, found := st.get("ok"); found {
		t.Error("ok's record outlived its settlement")
	}
}

// A store that cannot be read leaves the marks Failed, so the driver
// counts as it does without a store; a failing write is returned to a
// suspect start.
func TestStartLogStoreDown(t *testing.T) {
	down := errors.New("store down")
	st := &fakeStore{runs: map[string]int{}, err: down}
	l := driverkit.NewStartLog(st, "q", nil, 0)
	defer l.Close()
	m := &driverkit.StartMark{ID: "m", Earlier: 1}
	if err := l.Resolve(t.Context(), []*driverkit.StartMark{m}); !errors.Is(err, down) {
		t.Fatalf("Resolve: %v, want %v", err, down)
	}
	if !m.Failed() || m.Suspect() {
		t.Fatalf("failed %v suspect %v, want failed and not suspect", m.Failed(), m.Suspect())
	}
	s := &driverkit.StartMark{ID: "s", Earlier: 1}
	st.mu.Lock()
	st.err = nil
	st.mu.Unlock()
	if err := l.Resolve(t.Context(), []*driverkit.StartMark{s}); err != nil {
		t.Fatal(err)
	}
	st.mu.Lock()
	st.err = down
	st.mu.Unlock()
	if err := l.Started(t.Context(), []*driverkit.StartMark{s}); !errors.Is(err, down) {
		t.Fatalf("suspect Started: %v, want %v", err, down)
	}
}
