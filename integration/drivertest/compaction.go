package drivertest

import (
	"slices"
	"time"

	"github.com/keyorder/keyorder/lanes"
	"github.com/keyorder/keyorder/subscribe"
)

// compactionDeliversNewest: on a subscription created with compaction
// (Spec.Compaction, Exclusive), a backlog is resolved to the newest message
// of each key; the older ones are superseded (counted in the backend's
// Stats.Superseded), never dead-lettered. A message published while its
// key's newest message is in flight waits for it and is then delivered.
//
// Backends that cannot resolve a message without delivering it (Pub/Sub,
// SQS, Pulsar keep every message until it is acknowledged) declare this
// case Unsupported.
func compactionDeliversNewest(f *fixture) {
	p := f.publisher(nil)
	f.publish(p, "a1:A", "a2:A", "b1:B", "a3:A", "b2:B", "a4:A")
	// Published before any consumer runs: a4 and b2 are the newest waiting.
	g := newGate()
	// Shared workers: with keyed lanes A and B could hash onto one lane and
	// a4 would wait behind the gated b2.
	r := f.subscribe(&subscribe.Config{Workers: 2, Assign: lanes.Shared}, g.handler)
	f.waitFor(20, "a4 and b2 in flight", func() bool {
		got := f.rec.runningNow()
		return slices.Equal(got, []string{"a4", "b2"})
	})
	// A newer message of A while a4 is in flight: a4 is not superseded, a5
	// and a6 wait for it and a6 supersedes a5.
	f.publish(p, "a5:A", "a6:A")
	time.Sleep(f.unit)
	if got := f.rec.starts("A"); !slices.Equal(got, []string{"a4"}) {
		f.t.Fatalf("while a4 is in flight key A started %v, want only a4", got)
	}
	g.release(f.t, "b2", nil)
	g.release(f.t, "a4", nil)
	g.release(f.t, "a6", nil)
	f.waitFor(20, "a6 handled", func() bool { return slices.Contains(f.rec.succeeded("A"), "a6") })
	if got := f.rec.starts("A"); !slices.Equal(got, []string{"a4", "a6"}) {
		f.t.Fatalf("key A handled %v, want a4 then a6 (a1-a3 and a5 superseded)", got)
	}
	if got := f.rec.starts("B"); !slices.Equal(got, []string{"b2"}) {
		f.t.Fatalf("key B handled %v, want b2 (b1 superseded)", got)
	}
	st := counts(r.sub)
	if st.Backend == nil {
		f.t.Fatalf("a compacting backend must report Stats.Backend")
	}
	f.waitFor(20, "superseded counted", func() bool {
		st = counts(r.sub)
		return st.Backend.Superseded == 5 && st.Backend.Pending == 0
	})
	if st.DeadLettered != 0 || st.Backend.Dead != 0 {
		f.t.Fatalf("superseded messages must not be dead letters: %+v %+v", st, *st.Backend)
	}
}
