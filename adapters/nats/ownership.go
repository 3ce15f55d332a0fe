package nats

import (
	"context"
	"errors"
	"hash/fnv"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyorder/keyorder/driver"
)

// tick is the ownership renewal interval.
func (s *subscriptionDriver) tick() time.Duration { return s.opts.Lease / 4 }

// SetRevoke keeps the portable layer's revocation function.
func (s *subscriptionDriver) SetRevoke(revoke func(ctx context.Context, selected func(*driver.Message) bool) []*driver.Message) {
	s.mu.Lock()
	s.revoke = revoke
	s.mu.Unlock()
}

// join announces the process and starts its ownership loop, after taking
// its share of partitions once. Called by Receive.
func (s *subscriptionDriver) join(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errClosed
	}
	if s.joined {
		s.mu.Unlock()
		return nil
	}
	s.joined = true
	s.leave = make(chan struct{})
	s.loopEnd = make(chan struct{})
	leave, end := s.leave, s.loopEnd
	s.mu.Unlock()
	s.balance(ctx)
	s.wg.Add(1)
	go s.loop(leave, end)
	return nil
}

// loop renews, balances and watches the leases until leave is closed.
func (s *subscriptionDriver) loop(leave, end chan struct{}) {
	defer s.wg.Done()
	defer close(end)
	// The watchdog looks every watchdogEvery (a lease that ran out is
	// given up within that); renewals and balancing run every tick.
	t := time.NewTicker(min(s.tick(), watchdogEvery))
	defer t.Stop()
	next := time.Now().Add(s.tick())
	for {
		select {
		case <-leave:
			return
		case <-t.C:
		}
		if s.watchdog() {
			return
		}
		s.recordLazily()
		if time.Now().Before(next) {
			continue
		}
		next = time.Now().Add(s.tick())
		ctx, cancel := context.WithTimeout(context.Background(), s.tick())
		s.renew(ctx)
		s.balance(ctx)
		s.keepBacklog()
		cancel()
	}
}

// watchdog gives the whole member up when a handed-out message's lease
// ran out unrenewed (the process hangs): it releases every partition and
// leaves; the next Receive joins again.
func (s *subscriptionDriver) watchdog() bool {
	now := time.Now()
	s.mu.Lock()
	hung := false
	for d := range s.live {
		if !d.lost && now.After(d.deadline) {
			hung = true
			break
		}
	}
	if !hung {
		s.mu.Unlock()
		return false
	}
	s.opts.Logger.Warn("keyorder: nats: a lease ran out unrenewed; giving the subscription's partitions up", "subscription", s.sub)
	s.joined = false
	parts := make([]*part, 0, len(s.parts))
	for _, p := range s.parts {
		parts = append(parts, p)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range parts {
		wg.Add(1)
		go func() { defer wg.Done(); s.release(p, false) }()
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = s.leases.Delete(ctx, "m."+s.id)
	cancel()
	return true
}

// renew renews the member entry and every owned partition's entry at its
// revision; a partition whose entry moved on, or whose deadline passed, is
// given up.
func (s *subscriptionDriver) renew(ctx context.Context) {
	_, _ = s.leases.Put(ctx, "m."+s.id, []byte(s.id))
	s.mu.Lock()
	parts := make([]*part, 0, len(s.parts))
	for _, p := range s.parts {
		parts = append(parts, p)
	}
	s.mu.Unlock()
	for _, p := range parts {
		sent := time.Now()
		s.mu.Lock()
		rev := p.rev
		s.mu.Unlock()
		nrev, err := s.leases.Update(ctx, partKey(p.n), []byte(s.id), rev)
		s.mu.Lock()
		if err == nil {
			p.rev = nrev
			p.until = sent.Add(s.ttl - s.tick())
		}
		expired := time.Now().After(p.until)
		revoking := p.revoking
		s.mu.Unlock()
		if err != nil && (errors.Is(err, jetstream.ErrKeyExists) || expired) && !revoking {
			s.opts.Logger.Warn("keyorder: nats: partition ownership lost", "subscription", s.sub, "partition", p.n, "err", err)
			go s.release(p, false)
		}
	}
}

func partKey(n int) string { return "p." + strconv.Itoa(n) }

// balance takes free partitions up to the process's share of them
// (partitions / members, rounded up) and releases one above it.
func (s *subscriptionDriver) balance(ctx context.Context) {
	members := 1
	if kl, err := s.leases.ListKeysFiltered(ctx, "m.*"); err == nil {
		seen := map[string]bool{"m." + s.id: true}
		for k := range kl.Keys() {
			seen[k] = true
		}
		members = len(seen)
	} else {
		_, _ = s.leases.Put(ctx, "m."+s.id, []byte(s.id))
	}
	share := (s.nparts + members - 1) / members
	s.mu.Lock()
	owned := 0
	var extra *part
	for _, p := range s.parts {
		if !p.revoking {
			owned++
			if extra == nil || p.n > extra.n {
				extra = p
			}
		}
	}
	s.mu.Unlock()
	if owned > share && extra != nil {
		go s.release(extra, true)
		return
	}
	h := fnv.New32a()
	h.Write([]byte(s.id))
	start := int(h.Sum32() % uint32(s.nparts))
	// The partitions still wanted are tried share-owned at a time, each
	// try's entry and consumer requests in parallel (a process joining an
	// idle subscription takes every partition: one after another that was
	// 16 requests in a row before its first message), the next ones only
	// for those another process holds.
	for i := 0; i < s.nparts && owned < share; {
		var try []int
		for ; i < s.nparts && len(try) < share-owned; i++ {
			n := (start + i) % s.nparts
			s.mu.Lock()
			_, have := s.parts[n]
			closed := s.closed || !s.joined
			s.mu.Unlock()
			if closed {
				return
			}
			if !have {
				try = append(try, n)
			}
		}
		var wg sync.WaitGroup
		var took atomic.Int32
		for _, n := range try {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if s.take(ctx, n) {
					took.Add(1)
				}
			}()
		}
		wg.Wait()
		owned += int(took.Load())
	}
}

// take takes partition n if no process holds it, and reports whether it
// did.
func (s *subscriptionDriver) take(ctx context.Context, n int) bool {
	sent := time.Now()
	rev, err := s.leases.Create(ctx, partKey(n), []byte(s.id))
	if err != nil {
		return false
	}
	if err := s.acquire(ctx, n, rev, sent); err != nil {
		s.opts.Logger.Warn("keyorder: nats: partition not taken", "subscription", s.sub, "partition", n, "err", err)
		_ = s.leases.Delete(ctx, partKey(n), jetstream.LastRevision(rev))
		return false
	}
	return true
}

// acquire starts consuming partition n, owned at revision rev.
func (s *subscriptionDriver) acquire(ctx context.Context, n int, rev uint64, sent time.Time) error {
	cons, err := s.js.CreateOrUpdateConsumer(ctx, s.stream, jetstream.ConsumerConfig{
		Durable:       consumerName(s.sub, n),
		FilterSubject: s.stream + "." + strconv.Itoa(n) + ".>",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.opts.Lease,
		MaxDeliver:    -1,
		MaxAckPending: s.opts.MaxPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return err
	}
	p := &part{n: n, cons: cons, rev: rev, until: sent.Add(s.ttl - s.tick()),
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	// The previous owner's unacknowledged messages come back as their
	// AckWait runs out, in the order they expire, not in stream order (a
	// message extended later expires later). None of the partition is
	// handed out until all of them are in (or two leases passed), and the
	// backlog is kept in stream order.
	if info := cons.CachedInfo(); info != nil && info.NumAckPending > 0 {
		p.leftover = info.NumAckPending
		p.leftSeq = info.Delivered.Stream
		p.leftBy = time.Now().Add(2 * s.opts.Lease)
	} else {
		p.settled0 = true
	}
	s.mu.Lock()
	if s.closed || !s.joined {
		s.mu.Unlock()
		return errClosed
	}
	s.parts[n] = p
	s.mu.Unlock()
	go s.fetch(p)
	return nil
}

// release stops consuming p: no more hand-outs, the fetcher stopped, the
// portable layer's revocation run (graceful: waiting for the messages in
// flight up to RevokeTimeout and their leases), then everything still held
// given back (unrun ones uncounted) and the ownership entry deleted.
func (s *subscriptionDriver) release(p *part, graceful bool) {
	s.mu.Lock()
	if p.revoking {
		s.mu.Unlock()
		return
	}
	p.revoking = true
	revoke := s.revoke
	s.mu.Unlock()
	close(p.stop)
	<-p.done
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.RevokeTimeout)
	defer cancel()
	if !graceful {
		rctx, rcancel := context.WithTimeout(ctx, s.tick())
		defer rcancel()
		ctx = rctx
	}
	var forgotten []*delivery
	if revoke != nil {
		var still map[*delivery]bool
		selected := func(m *driver.Message) bool {
			d, ok := m.AckID.(*delivery)
			return ok && d.p == p
		}
		running := revoke(ctx, selected)
		still = map[*delivery]bool{}
		for _, m := range running {
			if d, ok := m.AckID.(*delivery); ok {
				still[d] = true
			}
		}
		s.mu.Lock()
		for d := range s.live {
			if d.p == p && !still[d] {
				forgotten = append(forgotten, d)
			}
		}
		s.mu.Unlock()
	}
	// Wait for what runs to settle, no longer than ctx and its lease.
	for {
		s.mu.Lock()
		waiting := false
		now := time.Now()
		for d := range s.live {
			if d.p == p && !slicesContains(forgotten, d) && now.Before(d.deadline) && graceful {
				waiting = true
			}
		}
		ch := s.settled
		s.mu.Unlock()
		if !waiting {
			break
		}
		select {
		case <-ch:
		case <-ctx.Done():
		case <-time.After(s.tick()):
		}
		if ctx.Err() != nil {
			break
		}
	}
	var back []*delivery
	s.mu.Lock()
	for _, in := range p.backlog {
		back = append(back, &delivery{p: p, in: in})
	}
	p.backlog = nil
	for d := range s.live {
		if d.p != p {
			continue
		}
		d.lost = true
		d.settled = true
		delete(s.live, d)
		back = append(back, d)
	}
	rev := p.rev
	s.mu.Unlock()
	gctx, gcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer gcancel()
	s.giveBack(gctx, back)
	_ = s.leases.Delete(gctx, partKey(p.n), jetstream.LastRevision(rev))
	s.mu.Lock()
	if s.parts[p.n] == p {
		delete(s.parts, p.n)
	}
	close(s.settled)
	s.settled = make(chan struct{})
	s.mu.Unlock()
}
