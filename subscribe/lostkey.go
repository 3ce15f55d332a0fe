package subscribe

// This file: holding a key's later messages after a lost lease, under
// in-process hold.
//
// A broker without native hold may keep a deadline per delivery (Pub/Sub):
// it can take back one message of a key (its lease lost) while the key's
// later messages, received after it, are still leased here. The broker
// redelivers the lost one later; nothing behind it may run in this process
// before its redelivery has run, or a later message would complete first.
// So when a lease is lost under Ordered in-process hold, the key gets a
// barrier: the set of its messages that are away from this process (lost,
// or given back) and expected back, each with its rank, the order in which
// this process first received it, which is the key's order. A message of
// the key comes to run only when no message ranked before it is away; one
// that may not is put aside (kept leased, holding no flow-control token,
// counted as held). When a message away comes back and may run, what is
// put aside goes back to the broker first and is expected back in turn: a
// broker that redelivers per delivery skips the messages this process
// still leases and hands out the key's later ones, so a message kept aside
// past its turn would come back after messages ranked behind it. The barrier goes
// when nothing of the key is away or aside. One whose messages do not come
// back to this process (another consumer took them) is lifted after
// barrierLeases lease periods without progress while no handler runs a
// message of its key here and no message away has been received again,
// what it holds given back.
//
// A message whose DeadLetter call did not land (it failed, or its answer
// said the lease was lost) is away in the same sense: the broker
// redelivers it unless the call took effect after all and only its answer
// was lost, which no driver tells apart. So it is away as a dead letter
// (barrier.dead), and the key's later messages do not wait aside for it:
// each goes back to the broker at once, and the broker's key order
// answers. A broker that streams a key hands out its messages in key
// order, so the dead letter comes back first if the call did not land (it
// is dead-lettered again unrun: undeadNote), and a later message given
// back after the call failed comes back first only if it did land: then
// the dead letter is resolved and the later message runs. Waiting for a
// redelivery that never comes would hold the key barrierLeases lease
// periods (conformance case RedriveAfterDeadLetterErrorRuns). This needs a
// broker whose Release hands a message out again while this process runs
// (driver.ReleaseRedeliverer); on one that keeps released messages until
// the process stops (Kafka, Pulsar) the key goes on after such a call.

import (
	"slices"
	"time"
)

// barrierLeases is how many lease durations a barrier waits for a
// redelivery before it gives up and gives back what it holds.
const barrierLeases = 3

// barrier is a key's wait for its messages away from this process (see
// the file comment). Guarded by Subscriber.mu.
type barrier struct {
	// away: the IDs of the key's messages lost or given back and not
	// received again since.
	away map[string]bool
	// rank: the receive order of the key's messages as first received by
	// this process, for those known when the barrier was set or sent
	// away since; a message not in it ranks by its own receive order.
	rank  map[string]uint64
	since time.Time // when it was set, or last saw a message come back
	aside []*item   // the key's messages put aside, in the order they came
	// dead: the IDs away whose DeadLetter call did not land, each with
	// the gen when it failed; sent: the gen when each message away was
	// sent away. A message of the key that comes back resolves the dead
	// letters ranked before it that failed before it was sent away.
	dead map[string]uint64
	sent map[string]uint64
	gen  uint64
}

// rankOf is its place in its key's order (see barrier.rank).
func (b *barrier) rankOf(it *item) uint64 {
	if r, ok := b.rank[it.m.ID]; ok {
		return r
	}
	return it.seq
}

// keepRank ranks it by its receive order unless it has an earlier rank
// already: a message has several items when it was redelivered, and its
// rank is its first receipt's whichever item the barrier sees first (a
// renewal reports its losses latest first, so the redelivery's item may
// come before the first one's).
func (b *barrier) keepRank(it *item) {
	if r, ok := b.rank[it.m.ID]; !ok || it.seq < r {
		b.rank[it.m.ID] = it.seq
	}
}

// sendAway records it as away, keeping its rank.
func (b *barrier) sendAway(it *item) {
	b.keepRank(it)
	b.away[it.m.ID] = true
	b.gen++
	b.sent[it.m.ID] = b.gen
}

// cameBack records that it, away, was received again: it is no longer
// away, nor are the dead letters ranked before it whose call failed
// before it was sent away (the broker would have handed them out first).
func (b *barrier) cameBack(it *item) {
	id := it.m.ID
	r := b.rankOf(it)
	for d, failed := range b.dead {
		if b.rank[d] < r && failed < b.sent[id] {
			delete(b.dead, d)
			delete(b.away, d)
			delete(b.sent, d)
		}
	}
	delete(b.away, id)
	delete(b.dead, id)
	delete(b.sent, id)
}

// deadBefore reports whether a dead letter ranked before r is away.
func (b *barrier) deadBefore(r uint64) bool {
	for id := range b.dead {
		if b.rank[id] < r {
			return true
		}
	}
	return false
}

// awayBefore reports whether a message ranked before r is away.
func (b *barrier) awayBefore(r uint64) bool {
	for id := range b.away {
		if b.rank[id] < r {
			return true
		}
	}
	return false
}

// barriers reports whether lost leases set barriers: Ordered with the
// process holding keys, on a broker without native hold.
func (s *Subscriber) barriers() bool {
	return s.holdKeys && !s.caps.NativeHold
}

// leaseLost sets the barrier of the keys of its (items just marked lost),
// or adds them to an existing one. Called with s.mu held.
func (s *Subscriber) leaseLost(its []*item) {
	if !s.barriers() {
		return
	}
	now := time.Now()
	for _, it := range its {
		if it.key == "" {
			continue
		}
		s.barrierOf(it.key, now).sendAway(it)
	}
}

// barrierOf returns key's barrier, set now if it has none. Called with s.mu
// held.
func (s *Subscriber) barrierOf(key string, now time.Time) *barrier {
	b := s.lostKeys[key]
	if b != nil {
		return b
	}
	if s.lostKeys == nil {
		s.lostKeys = map[string]*barrier{}
	}
	b = &barrier{away: map[string]bool{}, rank: map[string]uint64{}, since: now,
		dead: map[string]uint64{}, sent: map[string]uint64{}}
	s.lostKeys[key] = b
	// The key's messages held here rank by when they came.
	if h := s.holds[key]; h != nil {
		for o := h.head; o != nil; o = o.nextK {
			b.keepRank(o)
		}
	}
	return b
}

// deadLetterAway sets its key's barrier for it, whose DeadLetter call did
// not land (see the file comment), under in-process hold where the
// driver's Release hands messages out again (driver.ReleaseRedeliverer):
// elsewhere a message given back would not come back while this process
// runs, and the key goes on.
func (s *Subscriber) deadLetterAway(it *item) {
	if !s.barriers() || !s.releaseRedelivers || it.key == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.barrierOf(it.key, time.Now())
	b.sendAway(it)
	b.dead[it.m.ID] = b.gen
}

// behindBarrier reports whether it must not run now because its key waits
// for a message ranked before it; if so it puts it aside, or, when a dead
// letter ranked before it is away, returns it to give back at once. When
// it may run, the messages put aside are returned for the caller to give
// back (before it runs); they are expected back behind it. Called from
// prepare, off s.mu.
func (s *Subscriber) behindBarrier(it *item) (aside bool, giveBack []*item) {
	if !s.barriers() || it.key == "" {
		return false, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.lostKeys[it.key]
	if b == nil {
		return false, nil
	}
	came := b.away[it.m.ID] && !it.lost.Load()
	if came {
		b.cameBack(it)
		b.since = time.Now()
	}
	if r := b.rankOf(it); b.deadBefore(r) {
		// Back to the broker, whose key order tells whether the dead
		// letter landed (see the file comment).
		b.sendAway(it)
		return true, []*item{it}
	} else if b.awayBefore(r) {
		b.aside = append(b.aside, it)
		b.keepRank(it)
		if free := s.untoken(it); free > 0 {
			s.mu.Unlock()
			s.releaseTokens(free)
			s.mu.Lock()
		}
		return true, nil
	}
	if !came {
		// Ranked before every message away: what waits aside stays
		// (giving it back for a message the barrier was not waiting
		// for could cycle: the broker may redeliver, with what is given
		// back, the key's later messages held here).
		if len(b.away) == 0 && len(b.aside) == 0 {
			delete(s.lostKeys, it.key)
		}
		return false, nil
	}
	back := b.aside
	b.aside = nil
	for _, a := range back {
		b.sendAway(a)
	}
	if len(b.away) == 0 {
		delete(s.lostKeys, it.key)
	}
	return false, back
}

// expireBarriers lifts the barriers that have waited barrierLeases lease
// durations without a message coming back, and returns what they held to
// give back. Called from keepLeases, off s.mu.
func (s *Subscriber) expireBarriers(now time.Time) []*item {
	if !s.barriers() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*item
	for k, b := range s.lostKeys {
		if s.keyRunning(k) || now.Sub(b.since) >= barrierLeases*s.caps.LeaseDuration && s.awayHere(k, b) {
			// Its own handler holds the key up (one that outlives its
			// lease, say): no redelivery is due yet, and forgetting the
			// ranks now would let a later message overtake those given
			// back (seed 248 with KEYORDER_MODEL_CLASSES=loseOne). So
			// does a redelivery waiting here to come to run (seed 490
			// with KEYORDER_MODEL_CLASSES=settleLost: a Release that
			// timed out held its lane 21 s).
			b.since = now
			continue
		}
		if now.Sub(b.since) >= barrierLeases*s.caps.LeaseDuration {
			out = append(out, b.aside...)
			delete(s.lostKeys, k)
		}
	}
	return out
}

// awayHere reports whether a message away from b, key's barrier, has
// been received again and waits here to come to run (behind a slow
// give-back in its lane, say): the barrier is making progress. A delivery
// put aside does not count: one received again before its earlier
// delivery was reported lost waits aside for its own ID, and only the
// barrier's end lets it go (seed 2525 with
// KEYORDER_MODEL_CLASSES=settleLost never ended when it counted). Called
// with s.mu held.
func (s *Subscriber) awayHere(key string, b *barrier) bool {
	h := s.holds[key]
	if h == nil {
		return false
	}
	for o := h.head; o != nil; o = o.nextK {
		if b.away[o.m.ID] && !o.lost.Load() && !slices.Contains(b.aside, o) {
			return true
		}
	}
	return false
}

// keyRunning reports whether a handler runs a message of key in this
// process. Called with s.mu held.
func (s *Subscriber) keyRunning(key string) bool {
	h := s.holds[key]
	if h == nil {
		return false
	}
	for o := h.head; o != nil; o = o.nextK {
		o.mu.Lock()
		running := o.hctx != nil
		o.mu.Unlock()
		if running {
			return true
		}
	}
	return false
}

// liftAllBarriers lifts every barrier (Run is ending) and returns what
// they held, to give back.
func (s *Subscriber) liftAllBarriers() []*item {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*item
	for k, b := range s.lostKeys {
		out = append(out, b.aside...)
		delete(s.lostKeys, k)
	}
	return out
}
