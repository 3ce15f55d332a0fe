package kafka

// This file: group membership. Partitions assigned and their committed
// offsets read; partitions revoked and what is in flight on them taken back;
// a generation claimed; the watchdog that gives up a member whose lease ran
// out.

import (
	"context"
	"math"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keyorder/keyorder/driver"
)

// assigned creates the states of newly assigned partitions.
func (s *subscriptionDriver) assigned(g *generation, ps []int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range ps {
		if st := g.parts[p]; st != nil && !st.revoking {
			continue // still ours: keep what is in flight
		}
		g.parts[p] = &partState{p: p, gen: g, om: newOffsetMap(-1, ""), committed: -1}
	}
}

// fetched reads the committed offsets and metadata of the assigned
// partitions (before fetching records starts).
func (s *subscriptionDriver) fetched(g *generation, resp *kmsg.OffsetFetchResponse) {
	type committed struct {
		off  int64
		meta string
	}
	got := map[int32]committed{}
	add := func(topic string, id [16]byte, p int32, off int64, meta *string) {
		if topic != s.topic && id != s.topicID {
			return
		}
		c := committed{off: off}
		if meta != nil {
			c.meta = *meta
		}
		got[p] = c
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			add(t.Topic, [16]byte{}, p.Partition, p.Offset, p.Metadata)
		}
	}
	for _, gr := range resp.Groups {
		for _, t := range gr.Topics {
			for _, p := range t.Partitions {
				add(t.Topic, t.TopicID, p.Partition, p.Offset, p.Metadata)
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for p, ps := range g.parts {
		if ps.fetched {
			continue
		}
		ps.fetched = true
		if c, ok := got[p]; ok && c.off >= 0 {
			ps.om = newOffsetMap(c.off, c.meta)
			ps.committed, ps.committedMeta = c.off, c.meta
			if metaInUse(c.meta) {
				ps.unclean, ps.suspect = true, math.MaxInt64
			}
		}
	}
}

// signal wakes revocations waiting for records to settle. Called with
// s.mu held.
func (s *subscriptionDriver) signal() {
	if s.waiting == 0 {
		return
	}
	close(s.notify)
	s.notify = make(chan struct{})
}

// revoked handles partitions the group takes away (graceful: stop handing
// them out, wait for what is in flight, commit) or that are lost (no
// commit: another member may own them already).
func (s *subscriptionDriver) revoked(ctx context.Context, g *generation, ps []int32, graceful bool) {
	s.mu.Lock()
	if g.expired {
		s.mu.Unlock()
		return // the watchdog committed and gave the member up
	}
	var states []*partState
	var resume []int32
	for _, p := range ps {
		st := g.parts[p]
		if st == nil {
			continue
		}
		st.revoking = true
		st.backlog = nil
		if st.paused {
			st.paused = false
			resume = append(resume, p)
		}
		states = append(states, st)
	}
	revoke, closing := s.revoke, s.closed
	s.mu.Unlock()
	if len(resume) > 0 {
		g.fetch.ResumeFetchPartitions(map[string][]int32{s.topic: resume})
	}
	if revoke != nil && !closing && len(states) > 0 {
		s.takeBack(ctx, revoke, states, graceful)
	}
	if graceful {
		s.mu.Lock()
		s.waiting++
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			s.waiting--
			s.mu.Unlock()
		}()
		deadline := time.Now().Add(s.opts.RevokeTimeout)
		for {
			s.mu.Lock()
			busy := 0
			now := time.Now()
			for _, st := range states {
				busy += st.inflight
			}
			// A record whose lease ran out is not waited for.
			if busy > 0 {
				busy = 0
				for d := range s.live {
					if d.ps.gen == g && slices.Contains(states, d.ps) && now.Before(d.deadline) && !d.revoked {
						busy++
					}
				}
			}
			ch := s.notify
			s.mu.Unlock()
			if busy == 0 || now.After(deadline) || ctx.Err() != nil {
				break
			}
			t := time.NewTimer(min(time.Until(deadline), 100*time.Millisecond))
			select {
			case <-ch:
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
		}
	}
	// What is still in flight goes to the partitions' new owners; a
	// record whose handler started may have been running: its attempt
	// counts.
	s.mu.Lock()
	n := 0
	extra := map[*partState]map[int64]mark{}
	for d := range s.live {
		if slices.Contains(states, d.ps) {
			if d.started.Load() {
				if extra[d.ps] == nil {
					extra[d.ps] = map[int64]mark{}
				}
				extra[d.ps][d.off] = mark{n: d.prior + 1}
			}
			d.lost = true
			delete(s.live, d)
			n++
		}
	}
	s.mu.Unlock()
	if n > 0 {
		s.opts.Logger.Warn("keyorder: kafka: partitions revoked with records in flight; they go to their new owner",
			"topic", s.topic, "group", s.group, "records", n)
	}
	if graceful {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := s.commit(cctx, g, states, extra, true); err != nil {
			s.opts.Logger.Warn("keyorder: kafka: commit on revocation failed; records may be redelivered",
				"topic", s.topic, "group", s.group, "err", err)
		}
		cancel()
	}
	s.mu.Lock()
	for _, st := range states {
		if g.parts[st.p] == st {
			delete(g.parts, st.p)
		}
	}
	s.mu.Unlock()
}

// SetRevoke keeps the portable layer's revoke function, which the
// revocation path calls to take back synchronously what the process holds
// of the revoked partitions.
func (s *subscriptionDriver) SetRevoke(revoke func(ctx context.Context, selected func(*driver.Message) bool) []*driver.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.revoke = revoke
}

// takeBack has the portable layer forget the records of states that wait
// in the process (a parked retry, a throttled record, records behind a
// held key), so that none of them starts here once the revocation
// returned, and wait for those that run: up to RevokeTimeout for a
// graceful revocation, RevokeLostTimeout for lost partitions. The
// forgotten records are not waited for by the revocation (their leases
// count as ended); the commit counts an attempt for each whose handler
// had started. It is never called from Close (Close is a call of the
// portable layer, which settled what it could before it).
func (s *subscriptionDriver) takeBack(ctx context.Context, revoke func(context.Context, func(*driver.Message) bool) []*driver.Message, states []*partState, graceful bool) {
	wait := RevokeLostTimeout
	if graceful {
		wait = s.opts.RevokeTimeout
	}
	rctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	running := revoke(rctx, func(m *driver.Message) bool {
		d, ok := m.AckID.(*delivery)
		return ok && d != nil && slices.Contains(states, d.ps)
	})
	still := map[*delivery]bool{}
	for _, m := range running {
		if d, ok := m.AckID.(*delivery); ok {
			still[d] = true
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for d := range s.live {
		if slices.Contains(states, d.ps) && !still[d] {
			d.revoked = true // forgotten: not waited for
		}
	}
	s.signal()
}

// claim commits the claim (metaPrefixInUse) of g's partitions that have
// records to hand out and none handed out yet: a member that dies from
// then on leaves a commit that says so to the next owner.
func (s *subscriptionDriver) claim(ctx context.Context, g *generation) error {
	var states []*partState
	s.mu.Lock()
	for _, st := range g.parts {
		if st.claimed || st.revoking || !st.fetched || len(st.backlog) == 0 {
			continue
		}
		if st.om.base < 0 {
			st.om.base = st.backlog[0].Offset
		}
		states = append(states, st)
	}
	s.mu.Unlock()
	if len(states) == 0 {
		return nil
	}
	if err := s.commit(ctx, g, states, nil, false); err != nil {
		return err
	}
	s.mu.Lock()
	for _, st := range states {
		if st.committedMeta != "" && metaInUse(st.committedMeta) {
			st.claimed = true
		}
	}
	s.mu.Unlock()
	return nil
}

// watchdog gives the member up when a lease ran out: it stops handing out
// records, commits (counting an attempt for each expired record that had
// started), and leaves the group, so that the group moves its partitions.
// The next Receive joins again.
func (s *subscriptionDriver) watchdog() {
	defer s.wg.Done()
	t := time.NewTicker(max(s.opts.Lease/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		s.mu.Lock()
		g := s.gen
		expired := 0
		for d := range s.live {
			if g != nil && d.ps.gen == g && now.After(d.deadline) && !d.revoked {
				expired++
			}
		}
		if expired == 0 {
			s.mu.Unlock()
			continue
		}
		g.expired = true
		s.gen = nil
		extra := map[*partState]map[int64]mark{}
		var states []*partState
		for _, st := range g.parts {
			states = append(states, st)
		}
		for d := range s.live {
			if d.ps.gen != g {
				continue
			}
			if d.started.Load() {
				if extra[d.ps] == nil {
					extra[d.ps] = map[int64]mark{}
				}
				extra[d.ps][d.off] = mark{n: d.prior + 1}
			}
			d.lost = true
			delete(s.live, d)
		}
		s.signal()
		s.mu.Unlock()
		s.opts.Logger.Warn("keyorder: kafka: a lease ran out; leaving the group so that it moves this member's partitions",
			"topic", s.topic, "group", s.group, "expired", expired)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := s.commit(ctx, g, states, extra, true); err != nil {
			s.opts.Logger.Warn("keyorder: kafka: commit before leaving failed", "err", err)
		}
		cancel()
		g.cl.Close()
	}
}
