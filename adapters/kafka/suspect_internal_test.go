package kafka

import (
	"context"
	"slices"
	"strings"
	"testing"
)

// uncleanFixture is handOutFixture whose partition 0 was taken over from
// a member that died (its last commit a claim, metaPrefixInUse) with
// charges for the given offsets; every record of it is a suspect.
func uncleanFixture(t *testing.T, maxMeta int, charges map[int64]mark, recs map[int32][]int64) (*subscriptionDriver, *generation, *commitLog) {
	t.Helper()
	s, g, _ := handOutFixture(0, recs)
	if maxMeta > 0 {
		s.opts.MaxMetadataBytes = maxMeta
	}
	meta := newOffsetMap(0, "").encode(charges, MaxMetadataBytesDefault, true)
	if !metaInUse(meta) {
		t.Fatalf("claim metadata %q", meta)
	}
	st := g.parts[0]
	st.om, st.committed, st.committedMeta = newOffsetMap(0, meta), 0, meta
	st.unclean, st.suspect = true, 1000
	log := &commitLog{}
	s.sendCommit = log.send
	s.gen = g
	return s, g, log
}

// TestChargedSuspectsRunAlone: a record charged by a member that died
// while it ran (p0/1) is handed out only when nothing else is in flight,
// and nothing else (of any partition) is handed out while it runs, so
// that if it kills this process too no other record is charged for it. It
// comes as its next attempt. A suspect's start is committed before
// Started returns (marked in use, with the run counted).
func TestChargedSuspectsRunAlone(t *testing.T) {
	s, g, log := uncleanFixture(t, 0, map[int64]mark{1: {n: 1}}, map[int32][]int64{0: {1, 2, 4}, 1: {3}})
	ctx := context.Background()
	hand := func() []string {
		s.mu.Lock()
		defer s.mu.Unlock()
		ms := s.handOut(g, 100, nil)
		var out []string
		for _, m := range ms {
			out = append(out, string(m.Payload)+"@"+string(rune('0'+m.Attempt)))
		}
		return out
	}
	first := hand()
	if want := []string{"p0/0@1"}; !slices.Equal(first, want) {
		t.Fatalf("handed out %v, want %v (p0/1 is charged: it waits for p0/0)", first, want)
	}
	if more := hand(); len(more) != 0 {
		t.Fatalf("with p0/0 in flight handed out %v", more)
	}
	ackFirst := func() {
		t.Helper()
		for d := range s.live {
			if err := s.settle(d, true); err != nil {
				t.Fatal(err)
			}
		}
	}
	s.mu.Lock()
	ackFirst()
	s.mu.Unlock()
	if alone := hand(); !slices.Equal(alone, []string{"p0/1@2"}) {
		t.Fatalf("handed out %v, want p0/1 alone as attempt 2", alone)
	}
	if more := hand(); len(more) != 0 {
		t.Fatalf("with the charged p0/1 in flight handed out %v", more)
	}
	s.mu.Lock()
	ackFirst()
	s.mu.Unlock()
	s.mu.Lock()
	ms := s.handOut(g, 100, nil)
	s.mu.Unlock()
	if got := names(ms); !slices.Equal(got, []string{"p1/0", "p0/2"}) {
		t.Fatalf("then handed out %v, want p1/0 p0/2", got)
	}
	if err := s.Started(ctx, ms[1:]); err != nil {
		t.Fatal(err)
	}
	if len(log.sent) != 1 {
		t.Fatalf("commits on a suspect's start: %v, want one", log.sent)
	}
	meta := log.sent[0][0]
	_, att, _, err := parseMeta(2, meta)
	if err != nil || !strings.HasPrefix(meta, metaPrefixInUse) || att[2] != 1 {
		t.Fatalf("start commit %q: attempts %v (err %v), want in use with offset 2 counted", meta, att, err)
	}
	if err := s.Started(ctx, ms[:1]); err != nil { // p1/0 is no suspect
		t.Fatal(err)
	}
	if len(log.sent) != 1 {
		t.Fatalf("a clean partition's start was committed at once: %v", log.sent)
	}
}

// TestHandOutStopsAtLimit: suspects are handed out only as far as the
// commit metadata can carry their starts (at MetadataBytesMin, 3), one
// more each time one completes; a clean partition is not held by it.
func TestHandOutStopsAtLimit(t *testing.T) {
	s, g, _ := uncleanFixture(t, MetadataBytesMin, nil, map[int32][]int64{0: {1, 2, 3, 4, 5, 6}, 1: {7, 8, 9, 10}})
	if room := s.markRoom(); room != 3 {
		t.Fatalf("room %d at %d bytes, want 3", room, MetadataBytesMin)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.handOut(g, 100, nil)
	if got := names(out); !slices.Equal(got, []string{"p0/0", "p0/1", "p0/2", "p1/0", "p1/1", "p1/2", "p1/3"}) {
		t.Fatalf("handed out %v, want 3 suspects of p0 and all of p1", got)
	}
	if more := s.handOut(g, 100, nil); len(more) != 0 {
		t.Fatalf("at the limit handed out %v", names(more))
	}
	if err := s.settle(out[1].AckID.(*delivery), true); err != nil {
		t.Fatal(err)
	}
	if got := names(s.handOut(g, 100, nil)); !slices.Equal(got, []string{"p0/3"}) {
		t.Fatalf("after one completed handed out %v, want p0/3", got)
	}
}
