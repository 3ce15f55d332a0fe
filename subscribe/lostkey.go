package subscribe

// This file: holding a key's later messages after a lost lease, under
// in-process hold.
//
// A broker without native hold may keep a deadline per delivery (Pub/Sub):
// it can take back one message of a key (its lease lost) while the key's
// later messages, received after it, are still leased here. The broker
// redelivers the lost one, and those after it, later; nothing behind the
// lost one may run in this process before its redelivery has run, or a
// later message would complete first. So when a lease is lost under
// Ordered in-process hold, the key gets a barrier naming the lost message:
// its later messages that come to run meanwhile are put aside (kept
// leased, holding no flow-control token, counted as held), and the
// redelivery of the lost message, when it comes to run, lifts the barrier
// and gives the put-aside messages back to the broker, which redelivers
// them behind it (a streaming broker redelivers them anyway). A barrier
// whose redelivery does not come to this process (another consumer took
// it) is lifted after barrierTimeout lease periods, its messages given
// back likewise.

import (
	"time"
)

// barrierLeases is how many lease durations a barrier waits for the lost
// message's redelivery before it gives up and gives back what it holds.
const barrierLeases = 3

// barrier is a key's wait for the redelivery of its lost message (see the
// file comment). Guarded by Subscriber.mu.
type barrier struct {
	id    string    // the lost message's ID
	seq   uint64    // its receive order
	since time.Time // when it was set
	aside []*item   // the key's later messages put aside, in order
}

// barriers reports whether lost leases set barriers: Ordered with the
// process holding keys, on a broker without native hold.
func (s *Subscriber) barriers() bool {
	return s.holdKeys && !s.caps.NativeHold
}

// leaseLost sets the barrier of the keys of its (items just marked lost),
// or moves an existing one to an earlier lost message. Called with s.mu
// held.
func (s *Subscriber) leaseLost(its []*item) {
	if !s.barriers() {
		return
	}
	for _, it := range its {
		if it.key == "" {
			continue
		}
		b := s.lostKeys[it.key]
		switch {
		case b == nil:
			if s.lostKeys == nil {
				s.lostKeys = map[string]*barrier{}
			}
			s.lostKeys[it.key] = &barrier{id: it.m.ID, seq: it.seq, since: time.Now()}
		case it.seq < b.seq && it.m.ID != b.id:
			b.id, b.seq = it.m.ID, it.seq
		}
	}
}

// behindBarrier reports whether it must not run now because its key waits
// for a lost message's redelivery; if so it puts it aside. When it is that
// redelivery, it lifts the barrier, and the messages put aside are
// returned for the caller to give back (before it runs). Called from
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
	if it.m.ID == b.id && !it.lost.Load() {
		delete(s.lostKeys, it.key)
		return false, b.aside
	}
	if it.seq < b.seq {
		// Received before the lost one: not behind it.
		return false, nil
	}
	b.aside = append(b.aside, it)
	free := s.untoken(it)
	if free > 0 {
		s.mu.Unlock()
		s.releaseTokens(free)
		s.mu.Lock()
	}
	return true, nil
}

// expireBarriers lifts the barriers that have waited barrierLeases lease
// durations for a redelivery that did not come, and returns what they held
// to give back. Called from keepLeases, off s.mu.
func (s *Subscriber) expireBarriers(now time.Time) []*item {
	if !s.barriers() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*item
	for k, b := range s.lostKeys {
		if now.Sub(b.since) >= barrierLeases*s.caps.LeaseDuration {
			out = append(out, b.aside...)
			delete(s.lostKeys, k)
		}
	}
	return out
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
