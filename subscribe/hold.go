package subscribe

// This file: holding a key in process while its head waits on a time
// (parking), for brokers without native hold, and the outstanding set.
//
// One owner per key: under holdKeys, each key with outstanding items has a
// keyHold, the single source of truth for that key in this process: which
// of its received items are outstanding (an intrusive list, so park, unpark
// and removal touch only the key's own items) and how many of them wait
// in process on a time. Subscriber.holds maps keys to their keyHold;
// nothing else counts parked items.

// keyHold is the per-key state of a key while it has outstanding items
// (under holdKeys). Guarded by Subscriber.mu.
type keyHold struct {
	// parked counts the key's items waiting in process on a time (a retry
	// or a not-before time). While it is above zero the key's other items
	// wait behind them and, like them, hold no flow-control token, so a
	// parked key cannot stop the others: they count against
	// Config.MaxHeld instead (Subscriber.held, waitHeld), and the lanes
	// have room for all of them.
	parked int
	// head and tail list the key's outstanding items (item.prevK/nextK).
	head, tail *item
	n          int
}

// holdsSpareMax bounds the keyHolds kept for reuse.
const holdsSpareMax = 1024

// addOutstanding records a received item as outstanding, and under
// holdKeys on its key's hold. Called with s.mu held.
func (s *Subscriber) addOutstanding(it *item) {
	s.outstanding.add(it)
	s.peak = max(s.peak, s.outstanding.n)
	if !it.hasToken {
		it.held = true
		s.held++
	}
	if !s.holdKeys || it.key == "" {
		return
	}
	h := s.holdFor(it.key)
	it.inHold, it.hold = true, h
	it.prevK, it.nextK = h.tail, nil
	if h.tail != nil {
		h.tail.nextK = it
	} else {
		h.head = it
	}
	h.tail = it
	h.n++
}

// holdFor returns key's hold, made when the key has none. Called with s.mu
// held.
func (s *Subscriber) holdFor(key string) *keyHold {
	h := s.holds[key]
	if h == nil {
		if n := len(s.holdsSpare); n > 0 {
			h = s.holdsSpare[n-1]
			s.holdsSpare[n-1] = nil
			s.holdsSpare = s.holdsSpare[:n-1]
		} else {
			h = &keyHold{}
		}
		s.holds[key] = h
	}
	return h
}

// removeOutstanding takes an item out of the outstanding set and its key's
// hold; a hold left with no items and nothing parked goes. Idempotent.
// Called with s.mu held.
func (s *Subscriber) removeOutstanding(it *item) {
	s.outstanding.remove(it)
	if it.held {
		it.held = false
		s.held--
		if s.heldWait && s.held < s.cfg.MaxHeld {
			s.heldWait = false
			select {
			case s.heldRoom <- struct{}{}:
			default:
			}
		}
	}
	if !it.inHold {
		return
	}
	h := it.hold
	if it.prevK != nil {
		it.prevK.nextK = it.nextK
	} else {
		h.head = it.nextK
	}
	if it.nextK != nil {
		it.nextK.prevK = it.prevK
	} else {
		h.tail = it.prevK
	}
	it.inHold, it.hold, it.prevK, it.nextK = false, nil, nil, nil
	h.n--
	s.dropHoldIfIdle(it.key, h)
}

// dropHoldIfIdle forgets a key's hold once nothing of the key is
// outstanding or parked. Called with s.mu held.
func (s *Subscriber) dropHoldIfIdle(key string, h *keyHold) {
	if h.n > 0 || h.parked > 0 {
		return
	}
	delete(s.holds, key)
	if len(s.holdsSpare) < holdsSpareMax {
		*h = keyHold{}
		s.holdsSpare = append(s.holdsSpare, h)
	}
}

// untoken takes an outstanding item's flow-control token, if it has one,
// and counts the item held (Subscriber.held) instead; it returns how many
// tokens to release (0 or 1). Called with s.mu held.
func (s *Subscriber) untoken(it *item) int {
	if !it.hasToken {
		return 0
	}
	it.hasToken = false
	if it.inOut && !it.held {
		it.held = true
		s.held++
	}
	return 1
}

// forget drops an item from the outstanding set and gives back its token.
func (s *Subscriber) forget(it *item) {
	s.mu.Lock()
	s.removeOutstanding(it)
	tok := it.hasToken
	it.hasToken = false
	s.mu.Unlock()
	if tok {
		s.releaseTokens(1)
	}
}

// forgetAll is forget for several items, with one lock and one release.
func (s *Subscriber) forgetAll(its []*item) {
	toks := 0
	s.mu.Lock()
	for _, it := range its {
		s.removeOutstanding(it)
		if it.hasToken {
			it.hasToken = false
			toks++
		}
	}
	s.mu.Unlock()
	s.releaseTokens(toks)
}

// park gives back the token of an item that waits in process for its retry.
// Under holdKeys it parks the item's key: the key's items already received
// wait behind it and give back their tokens too. It touches the key's own
// items only.
func (s *Subscriber) park(it *item) {
	free := 0
	s.mu.Lock()
	free += s.untoken(it)
	if s.holdKeys && it.key != "" {
		h := s.holdFor(it.key)
		it.parked = true
		h.parked++
		for o := h.head; o != nil; o = o.nextK {
			free += s.untoken(o)
		}
	}
	s.mu.Unlock()
	s.releaseTokens(free)
}

// unpark is called when a parked item's time has come.
func (s *Subscriber) unpark(it *item) {
	s.mu.Lock()
	it.parked = false
	if h := s.holds[it.key]; h != nil {
		h.parked--
		s.dropHoldIfIdle(it.key, h)
	}
	s.mu.Unlock()
}

// drop forgets an item whose lease was lost: the broker redelivers it. The
// rest of its chain must not run before that redelivery, so the chain goes
// back too.
func (s *Subscriber) drop(it *item) {
	if it.chain != nil {
		it.chain.broken.Store(true)
	}
	s.noteUnrun(it)
	s.forget(it)
}

// outList is the set of outstanding items: a list linked through the
// items themselves (item.prevO, nextO), so that adding and removing one,
// once per message each, touch no map. Guarded by Subscriber.mu.
type outList struct {
	head *item
	n    int
}

func (l *outList) add(it *item) {
	it.inOut = true
	it.prevO, it.nextO = nil, l.head
	if l.head != nil {
		l.head.prevO = it
	}
	l.head = it
	l.n++
}

// remove takes it out of the list if it is in; idempotent.
func (l *outList) remove(it *item) {
	if !it.inOut {
		return
	}
	if it.prevO != nil {
		it.prevO.nextO = it.nextO
	} else {
		l.head = it.nextO
	}
	if it.nextO != nil {
		it.nextO.prevO = it.prevO
	}
	it.inOut, it.prevO, it.nextO = false, nil, nil
	l.n--
}
