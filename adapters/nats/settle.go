package nats

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyorder/keyorder/driver"
)

func deliveryOf(m *driver.Message) (*delivery, error) {
	d, ok := m.AckID.(*delivery)
	if !ok || d == nil {
		return nil, fmt.Errorf("nats: message %q was not received by this driver", m.ID)
	}
	return d, nil
}

// settle ends d's delivery. Called with s.mu held.
func (s *subscriptionDriver) settle(d *delivery) error {
	if d.settled {
		return nil
	}
	d.settled = true
	delete(s.live, d)
	d.p.live--
	select {
	case d.p.wake <- struct{}{}:
	default:
	}
	close(s.settled)
	s.settled = make(chan struct{})
	if d.lost {
		return errLost
	}
	return nil
}

// Ack acknowledges ms.
func (s *subscriptionDriver) Ack(ctx context.Context, ms []*driver.Message) error {
	var first error
	for _, m := range ms {
		d, err := deliveryOf(m)
		if err == nil {
			s.mu.Lock()
			err = s.settle(d)
			if err == nil {
				s.clearRun(d)
			}
			s.mu.Unlock()
		}
		if err == nil {
			err = d.in.msg.Ack()
		}
		if err != nil && first == nil {
			first = fmt.Errorf("nats: ack %q: %w", m.ID, err)
		}
	}
	return first
}

// Nack gives m back counted (its runs recorded first); the subscribe
// package never calls it (no native hold).
func (s *subscriptionDriver) Nack(ctx context.Context, m *driver.Message, delay time.Duration) error {
	d, err := deliveryOf(m)
	if err != nil {
		return err
	}
	if err := s.record(ctx, d); err != nil {
		return err
	}
	s.mu.Lock()
	err = s.settle(d)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return d.in.msg.NakWithDelay(delay)
}

// Release gives ms back: the server redelivers them at once (Nak). A
// message that never started has no record and comes back as the attempt
// it was; one that started is recorded first.
func (s *subscriptionDriver) Release(ctx context.Context, ms []*driver.Message) error {
	byPart := map[*part][]*delivery{}
	s.mu.Lock()
	for _, m := range ms {
		d, err := deliveryOf(m)
		if err != nil {
			s.mu.Unlock()
			return err
		}
		if d.settled {
			continue
		}
		_ = s.settle(d)
		if !d.lost {
			byPart[d.p] = append(byPart[d.p], d)
		}
	}
	s.mu.Unlock()
	for _, ds := range byPart {
		s.giveBack(ctx, ds)
	}
	return nil
}

// giveBack naks ds in stream order, after recording the runs of those
// that started.
func (s *subscriptionDriver) giveBack(ctx context.Context, ds []*delivery) {
	for _, d := range ds {
		if d.started.Load() {
			if err := s.record(ctx, d); err != nil {
				s.opts.Logger.Warn("keyorder: nats: recording the runs of a message given back", "subscription", s.sub, "err", err)
			}
		}
	}
	slices.SortFunc(ds, func(a, b *delivery) int {
		return cmp.Compare(a.in.meta.Sequence.Stream, b.in.meta.Sequence.Stream)
	})
	for _, d := range ds {
		_ = d.in.msg.Nak()
	}
}

// ExtendLeases renews the leases of ms (InProgress) and returns those
// whose partition is no longer this process's.
func (s *subscriptionDriver) ExtendLeases(ctx context.Context, ms []*driver.Message) ([]*driver.Message, error) {
	now := time.Now()
	var lost []*driver.Message
	var renew []jetstream.Msg
	s.mu.Lock()
	for _, m := range ms {
		d, err := deliveryOf(m)
		if err != nil {
			s.mu.Unlock()
			return lost, err
		}
		if d.lost || d.p.revoking && now.After(d.p.until) {
			lost = append(lost, m)
			continue
		}
		d.deadline = now.Add(s.opts.Lease)
		renew = append(renew, d.in.msg)
	}
	s.mu.Unlock()
	for _, m := range renew {
		_ = m.InProgress()
	}
	return lost, nil
}

func slicesContains(ds []*delivery, d *delivery) bool {
	for _, x := range ds {
		if x == d {
			return true
		}
	}
	return false
}

// ReleaseRedelivers implements driver.ReleaseRedeliverer: Release naks,
// and the server hands a nakked message out again at once to the
// partition's consumer, which this process owns, before the partition's
// messages it has not delivered yet (it serves redeliveries first); the
// driver keeps what it fetched in stream order and hands it out merged by
// stream sequence (TestReleaseRedeliversInKeyOrder).
func (s *subscriptionDriver) ReleaseRedelivers() bool { return true }
