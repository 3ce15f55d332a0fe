package kafka

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keyorder/keyorder/driver"
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

// TestRevocationTakesBackWhatWaits: partition 0 is revoked while the
// process holds three of its records: one running (it ends during the
// revocation), one that ran and waits for its retry, one that never
// started. The driver calls the portable layer's revoke once, selecting
// exactly partition 0's records, and the revocation does not wait for the
// forgotten ones (RevokeTimeout is an hour): it commits at once, counting
// the attempt of the one that ran, and reports them lost; partition 1's
// record stays leased. Lost partitions are taken back with a wait of at
// most RevokeLostTimeout. (Before the driver was Revocable, the revocation
// waited RevokeTimeout for the records the process only held.)
func TestRevocationTakesBackWhatWaits(t *testing.T) {
	s, g, _ := handOutFixture(0, map[int32][]int64{0: {1, 2, 3}, 1: {4}})
	s.opts.RevokeTimeout = time.Hour
	log := &commitLog{}
	s.sendCommit = log.send
	s.gen = g
	s.mu.Lock()
	out := s.handOut(g, 100, nil)
	s.mu.Unlock()
	if got := names(out); !slices.Equal(got, []string{"p0/0", "p0/1", "p0/2", "p1/0"}) {
		t.Fatalf("handed out %v", got)
	}
	ctx := context.Background()
	if err := s.Started(ctx, out[:2]); err != nil { // p0/1 ran, failed, waits
		t.Fatal(err)
	}
	type call struct {
		selected []string
		deadline time.Duration
	}
	calls := make(chan call, 2)
	s.SetRevoke(func(rctx context.Context, selected func(*driver.Message) bool) []*driver.Message {
		var c call
		for _, m := range out {
			if selected(m) {
				c.selected = append(c.selected, string(m.Payload))
			}
		}
		if dl, ok := rctx.Deadline(); ok {
			c.deadline = time.Until(dl)
		}
		calls <- c
		if len(c.selected) > 0 && c.selected[0] == "p0/0" {
			// The running handler ends before revoke returns.
			if err := s.Ack(ctx, out[:1]); err != nil {
				t.Error(err)
			}
		}
		return nil
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.revoked(ctx, g, []int32{0}, true)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the revocation still waits after 30 s for records the process only held")
	}
	if c := <-calls; !slices.Equal(c.selected, []string{"p0/0", "p0/1", "p0/2"}) {
		t.Fatalf("revoke selected %v, want partition 0's records", c.selected)
	}
	lost, err := s.ExtendLeases(ctx, out[1:])
	if err != nil {
		t.Fatal(err)
	}
	if got := names(lost); !slices.Equal(got, []string{"p0/1", "p0/2"}) {
		t.Errorf("leases lost %v, want p0/1 p0/2", got)
	}
	if len(log.sent) != 1 {
		t.Fatalf("commits %v, want one", log.sent)
	}
	_, att, _, err := parseMeta(1, log.sent[0][0])
	if err != nil || att[1] != 1 || att[2] != 0 {
		t.Fatalf("commit %q: attempts %v (err %v), want offset 1 counted once, offset 2 not", log.sent[0][0], att, err)
	}
	s.revoked(ctx, g, []int32{1}, false)
	if c := <-calls; !slices.Equal(c.selected, []string{"p1/0"}) || c.deadline <= 0 || c.deadline > RevokeLostTimeout {
		t.Fatalf("lost partition: revoke selected %v with %v left, want p1/0 within %v", c.selected, c.deadline, RevokeLostTimeout)
	}
}
