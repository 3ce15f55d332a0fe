package kafka

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyorder/keyorder/driver"
)

// pauseLog records PauseFetchPartitions and ResumeFetchPartitions calls.
type pauseLog struct{ calls []string }

func (l *pauseLog) PauseFetchPartitions(m map[string][]int32) map[string][]int32 {
	for t, ps := range m {
		slices.Sort(ps)
		l.calls = append(l.calls, fmt.Sprint("pause ", t, ps))
	}
	return nil
}

func (l *pauseLog) ResumeFetchPartitions(m map[string][]int32) {
	for t, ps := range m {
		slices.Sort(ps)
		l.calls = append(l.calls, fmt.Sprint("resume ", t, ps))
	}
}

// handOutFixture is a subscription driver with one generation whose
// partitions have the given backlogs: recs[p] are partition p's records'
// timestamps (milliseconds), offsets from 0.
func handOutFixture(maxPending int, recs map[int32][]int64) (*subscriptionDriver, *generation, *pauseLog) {
	s := &subscriptionDriver{topic: "t", opts: (&SubscriptionOptions{MaxPending: maxPending}).withDefaults(),
		notify: make(chan struct{}), live: map[*delivery]struct{}{}}
	pl := &pauseLog{}
	g := &generation{parts: map[int32]*partState{}, fetch: pl}
	for p, ts := range recs {
		st := &partState{p: p, gen: g, om: newOffsetMap(-1, ""), fetched: true, claimed: true, committed: -1}
		for i, ms := range ts {
			st.backlog = append(st.backlog, &kgo.Record{Topic: "t", Partition: p, Offset: int64(i),
				Timestamp: time.UnixMilli(ms), Value: []byte(fmt.Sprintf("p%d/%d", p, i))})
		}
		g.parts[p] = st
	}
	return s, g, pl
}

func names(ms []*driver.Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, string(m.Payload))
	}
	return out
}

// TestHandOutMergesByTimestamp: the partitions' backlogs come out merged
// by record timestamp, ties by partition, each partition's in offset
// order (even where its own timestamps go back), max records at a time.
func TestHandOutMergesByTimestamp(t *testing.T) {
	s, g, pl := handOutFixture(0, map[int32][]int64{
		0: {10, 40, 70},
		1: {20, 50},
		2: {30, 40, 5}, // 40 ties with p0/1; p2/2's clock went back
	})
	s.mu.Lock()
	first := s.handOut(g, 4, nil)
	rest := s.handOut(g, 100, nil)
	none := s.handOut(g, 100, nil)
	s.mu.Unlock()
	if got, want := names(first), []string{"p0/0", "p1/0", "p2/0", "p0/1"}; !slices.Equal(got, want) {
		t.Errorf("first 4: %v, want %v", got, want)
	}
	if got, want := names(rest), []string{"p2/1", "p2/2", "p1/1", "p0/2"}; !slices.Equal(got, want) {
		t.Errorf("then: %v, want %v", got, want)
	}
	if len(none) != 0 {
		t.Errorf("with the backlogs empty: %v", names(none))
	}
	if len(pl.calls) != 0 {
		t.Errorf("paused or resumed %v, want nothing (no partition at its bounds)", pl.calls)
	}
}

// TestHandOutBackpressure: a partition with MaxPending records pending
// stops being handed out (and is paused) while the others go on; its
// offset moving lets the next ones through, with no resume and pause in
// between when that brings it to its bound again, and it is resumed once
// below it.
func TestHandOutBackpressure(t *testing.T) {
	s, g, pl := handOutFixture(2, map[int32][]int64{
		0: {1, 2, 3, 4, 7},
		1: {5, 6},
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.handOut(g, 100, nil)
	if got, want := names(out), []string{"p0/0", "p0/1", "p1/0", "p1/1"}; !slices.Equal(got, want) {
		t.Fatalf("handed out %v, want %v", got, want)
	}
	if want := []string{"pause t[0 1]"}; !slices.Equal(pl.calls, want) {
		t.Fatalf("calls %v, want %v", pl.calls, want)
	}
	pl.calls = nil
	if err := s.settle(out[1].AckID.(*delivery), true); err != nil {
		t.Fatal(err)
	}
	if more := s.handOut(g, 100, nil); len(more) != 0 {
		t.Fatalf("with p0/0 pending (p0 still at its bound) handed out %v", names(more))
	}
	if err := s.settle(out[0].AckID.(*delivery), true); err != nil {
		t.Fatal(err)
	}
	more := s.handOut(g, 100, nil)
	if got, want := names(more), []string{"p0/2", "p0/3"}; !slices.Equal(got, want) {
		t.Fatalf("after p0/0 and p0/1 completed handed out %v, want %v", got, want)
	}
	// p0 is at its bound again: it stays paused, with no resume between.
	if len(pl.calls) != 0 {
		t.Fatalf("calls %v, want none", pl.calls)
	}
	if err := s.settle(more[0].AckID.(*delivery), true); err != nil {
		t.Fatal(err)
	}
	if err := s.settle(more[1].AckID.(*delivery), true); err != nil {
		t.Fatal(err)
	}
	last := s.handOut(g, 100, nil)
	if got, want := names(last), []string{"p0/4"}; !slices.Equal(got, want) {
		t.Fatalf("then handed out %v, want %v", got, want)
	}
	// p0 (one pending) is below its bound: resumed; p1 stays paused.
	if want := []string{"resume t[0]"}; !slices.Equal(pl.calls, want) {
		t.Fatalf("calls %v, want %v", pl.calls, want)
	}
}

// TestHandOutSkipsRevoking: a partition being revoked hands out nothing.
func TestHandOutSkipsRevoking(t *testing.T) {
	s, g, _ := handOutFixture(0, map[int32][]int64{0: {1, 3}, 1: {2}})
	g.parts[0].revoking = true
	s.mu.Lock()
	out := s.handOut(g, 100, nil)
	s.mu.Unlock()
	if got, want := names(out), []string{"p1/0"}; !slices.Equal(got, want) {
		t.Fatalf("handed out %v, want %v", got, want)
	}
}
