package kafka

// This file: committing. The committer writes each partition's completed
// offsets and their metadata (start records, attempt counts) to the group.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// committer commits completed offsets every CommitInterval.
func (s *subscriptionDriver) committer() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		g, states := s.dirtyStates()
		if len(states) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := s.commit(ctx, g, states, nil, false); err != nil && !errors.Is(err, kgo.ErrClientClosed) {
			s.opts.Logger.Debug("keyorder: kafka: commit failed; retried on the next tick", "err", err)
		}
		cancel()
	}
}

// dirtyStates returns the live member and its partitions with completions
// not committed yet (the committer's pick, made outside commitMu).
func (s *subscriptionDriver) dirtyStates() (*generation, []*partState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.gen
	var states []*partState
	if g != nil {
		for _, st := range g.parts {
			if st.dirty && !st.revoking {
				states = append(states, st)
			}
		}
	}
	return g, states
}

// commit commits the offset maps of states (attempts of extra added) as
// member of g. Commits are serialized, so a later one never lands before
// an earlier one. A commit that does not give the partitions up (final
// false: the committer's) re-checks under the lock that g still owns
// each partition and is not revoking it: the committer picks its
// partitions before taking the lock, and a revocation (or the watchdog)
// that commits meanwhile writes the attempt counts of what it takes
// back; a commit computed before it must not land after it.
func (s *subscriptionDriver) commit(ctx context.Context, g *generation, states []*partState, extra map[*partState]map[int64]mark, final bool) error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	type part struct {
		st   *partState
		off  int64
		meta string
	}
	var parts []part
	s.mu.Lock()
	for _, st := range states {
		if !st.fetched || st.om.base < 0 {
			continue
		}
		if !final && (st.revoking || g.expired || g.parts[st.p] != st || s.gen != g) {
			continue
		}
		att := extra[st]
		// Carry the attempts counted before for records in flight.
		for _, e := range st.om.live() {
			if e.d != nil && (e.d.prior > 0 || e.d.due > 0 || e.d.started.Load()) {
				if att == nil {
					att = map[int64]mark{}
				}
				if _, ok := att[e.off]; !ok {
					mk := mark{e.d.prior, e.d.due}
					if e.d.started.Load() {
						// It started: should this process die, its run
						// counts (recorded lazily, by the next commit;
						// before the handler for a suspect).
						mk = mark{n: e.d.prior + 1}
					}
					att[e.off] = mk
				}
			}
		}
		meta := st.om.encode(att, s.opts.MaxMetadataBytes, !final)
		st.dirty = false
		if st.om.base == st.committed && meta == st.committedMeta {
			continue
		}
		parts = append(parts, part{st, st.om.base, meta})
	}
	s.mu.Unlock()
	if len(parts) == 0 {
		return nil
	}
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group = s.group
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic = s.topic
	rt.TopicID = s.topicID
	for _, p := range parts {
		rp := kmsg.NewOffsetCommitRequestTopicPartition()
		rp.Partition = p.st.p
		rp.Offset = p.off
		rp.LeaderEpoch = -1
		meta := p.meta
		rp.Metadata = &meta
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	send := s.sendCommit
	if send == nil {
		send = sendCommit
	}
	resp, err := send(ctx, g, req)
	if err == nil {
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if e := kerr.ErrorForCode(p.ErrorCode); e != nil && err == nil {
					err = fmt.Errorf("partition %d: %w", p.Partition, e)
				}
			}
		}
	}
	s.mu.Lock()
	for _, p := range parts {
		if err == nil {
			p.st.committed, p.st.committedMeta = p.off, p.meta
		} else {
			p.st.dirty = true
		}
	}
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("kafka: commit %s of %s: %w", s.group, s.topic, err)
	}
	return nil
}

// sendCommit sends req as member of g.
func sendCommit(ctx context.Context, g *generation, req *kmsg.OffsetCommitRequest) (*kmsg.OffsetCommitResponse, error) {
	req.MemberID, req.Generation = g.cl.GroupMetadata()
	return req.RequestWith(ctx, g.cl)
}
