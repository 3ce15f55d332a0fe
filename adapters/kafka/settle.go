package kafka

// This file: settling a handed-out record (Ack, Nack, Release, Return),
// extending its lease and recording its start.

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/keyorder/keyorder/driver"
)

func deliveryOf(m *driver.Message) (*delivery, error) {
	d, ok := m.AckID.(*delivery)
	if !ok || d == nil {
		return nil, fmt.Errorf("kafka: message %q was not received by this driver", m.ID)
	}
	return d, nil
}

// settle ends d's delivery; done completes its offset. Called with s.mu
// held. It reports errLost when the partition is no longer this
// member's.
func (s *subscriptionDriver) settle(d *delivery, done bool) error {
	if d.settled {
		return nil
	}
	d.settled = true
	delete(s.live, d)
	if d.lost {
		return errLost
	}
	st := d.ps
	st.inflight--
	if s.gated && s.wake != nil {
		s.wake()
	}
	if done {
		st.om.complete(d.off)
		st.dirty = true
		if st.paused && !s.full(st) && s.wake != nil {
			s.wake()
		}
	}
	s.signal()
	return nil
}

// Ack completes ms: their offsets join the partition's offset map,
// committed within CommitInterval. A record whose partition was revoked
// fails with a lost-lease error: its new owner redelivers it.
func (s *subscriptionDriver) Ack(ctx context.Context, ms []*driver.Message) error {
	var first error
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range ms {
		d, err := deliveryOf(m)
		if err == nil {
			err = s.settle(d, true)
		}
		if err != nil && first == nil {
			first = fmt.Errorf("kafka: ack %q: %w", m.ID, err)
		}
	}
	return first
}

// Nack gives m up without completing it; the subscribe package never calls
// it (no native hold). Like Release, m is redelivered only after the
// partition changes owner or the member restarts.
func (s *subscriptionDriver) Nack(ctx context.Context, m *driver.Message, delay time.Duration) error {
	return s.Release(ctx, []*driver.Message{m})
}

// Release gives ms up without completing them: their offsets stay below
// the committed offset's reach, so the partition's next owner (after a
// rebalance, or this member after a restart) redelivers them, uncounted.
// The subscribe package releases at shutdown and when a lease is lost.
func (s *subscriptionDriver) Release(ctx context.Context, ms []*driver.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range ms {
		d, err := deliveryOf(m)
		if err != nil {
			return err
		}
		s.settle(d, false)
	}
	return nil
}

// Return gives rs back as Release does, and keeps each one's used attempts
// and retry due time in its partition's commit metadata, so that the next
// owner (another member after the rebalance, or this process restarted)
// delivers it with Attempt = Attempts+1, held until its due time (as
// Message.NotBefore). What the metadata carries is bounded by
// MaxMetadataBytes: past it the lowest offsets' counts are kept.
func (s *subscriptionDriver) Return(ctx context.Context, rs []driver.Returned) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range rs {
		d, err := deliveryOf(r.Message)
		if err != nil {
			return err
		}
		if !d.settled && !d.lost {
			// r.Attempts counts this process's runs: the start mark
			// (one more than prior) no longer applies.
			d.started.Store(false)
			d.prior = max(d.prior, r.Attempts)
			d.due = 0
			if !r.NotBefore.IsZero() {
				d.due = max(r.NotBefore.UnixMilli(), 1)
			}
			d.ps.dirty = true
		}
		s.settle(d, false)
	}
	return nil
}

// ExtendLeases renews the leases of ms and returns those whose partition
// was revoked or whose member was given up.
func (s *subscriptionDriver) ExtendLeases(ctx context.Context, ms []*driver.Message) ([]*driver.Message, error) {
	now := time.Now()
	var lost []*driver.Message
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range ms {
		d, err := deliveryOf(m)
		if err != nil {
			return lost, err
		}
		if d.lost || d.revoked {
			lost = append(lost, m)
			continue
		}
		d.deadline = now.Add(s.opts.Lease)
	}
	return lost, nil
}

// Started records that the handlers of ms start: a record whose lease runs
// out after it started counts an attempt.
//
// The start is recorded in the commit metadata, so that a process that
// dies while the handler runs still counts its run: lazily (the next
// periodic commit) for most records, and synchronously, before this
// returns, for a suspect: a record of a partition whose previous owner
// went away without committing, which may have run there unrecorded (a
// record that kills every process it runs in before the lazy commit would
// otherwise run forever as attempt 1).
func (s *subscriptionDriver) Started(ctx context.Context, ms []*driver.Message) error {
	var sync []*partState
	s.mu.Lock()
	for _, m := range ms {
		if d, ok := m.AckID.(*delivery); ok && d != nil {
			d.started.Store(true)
			if d.settled || d.lost {
				continue
			}
			d.ps.dirty = true
			if d.suspect && !slices.Contains(sync, d.ps) {
				sync = append(sync, d.ps)
			}
		}
	}
	var g *generation
	if len(sync) > 0 {
		g = sync[0].gen
	}
	s.mu.Unlock()
	if len(sync) == 0 {
		return nil
	}
	if err := s.commit(ctx, g, sync, nil, false); err != nil {
		return fmt.Errorf("kafka: record start: %w", err)
	}
	return nil
}
