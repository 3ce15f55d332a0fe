package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// commitLog records the offset commits a driver sends: partition ->
// metadata, in order.
type commitLog struct{ sent []map[int32]string }

func (l *commitLog) send(_ context.Context, _ *generation, req *kmsg.OffsetCommitRequest) (*kmsg.OffsetCommitResponse, error) {
	c := map[int32]string{}
	for _, t := range req.Topics {
		for _, p := range t.Partitions {
			c[p.Partition] = *p.Metadata
		}
	}
	l.sent = append(l.sent, c)
	return kmsg.NewPtrOffsetCommitResponse(), nil
}

// TestCommitPickedBeforeRevocationNeverLandsAfterIt: the committer picks
// a dirty partition, then the partition is revoked while a started record
// is in flight; the revocation commits the record's attempt. The
// committer's commit, computed from its earlier pick, must not land after
// it: the last commit of the partition carries the attempt. (Before the
// committer re-checked ownership under the commit lock, its commit went
// out second, without the attempt count.)
func TestCommitPickedBeforeRevocationNeverLandsAfterIt(t *testing.T) {
	s, g, _ := handOutFixture(0, map[int32][]int64{0: {1, 2, 3}})
	log := &commitLog{}
	s.sendCommit = log.send
	s.gen = g
	s.mu.Lock()
	out := s.handOut(g, 100, nil)
	s.mu.Unlock()
	if len(out) != 3 {
		t.Fatalf("handed out %d records", len(out))
	}
	ctx := context.Background()
	if err := s.Ack(ctx, out[:1]); err != nil {
		t.Fatal(err)
	}
	if err := s.Started(ctx, out[1:2]); err != nil {
		t.Fatal(err)
	}
	pg, picked := s.dirtyStates() // the committer's pick
	if len(picked) != 1 {
		t.Fatalf("committer picked %d partitions, want 1", len(picked))
	}
	// The revocation: its records' leases have run out, so it does not
	// wait for them; it commits offset 1's attempt.
	s.mu.Lock()
	for d := range s.live {
		d.deadline = time.Time{}
	}
	s.mu.Unlock()
	s.revoked(ctx, g, []int32{0}, true)
	if err := s.commit(ctx, pg, picked, nil, false); err != nil {
		t.Fatal(err)
	}
	if len(log.sent) == 0 {
		t.Fatal("nothing committed")
	}
	meta, ok := log.sent[len(log.sent)-1][0]
	if !ok {
		t.Fatalf("last commit %v does not name partition 0", log.sent[len(log.sent)-1])
	}
	_, att, _, err := parseMeta(1, meta)
	if err != nil || att[1] != 1 {
		t.Fatalf("commits %v: the last carries attempts %v (err %v), want offset 1 counted once", log.sent, att, err)
	}
	if len(log.sent) != 1 {
		t.Errorf("commits %v, want only the revocation's", log.sent)
	}
}
