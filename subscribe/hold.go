package subscribe

// This file: holding a key in process while its head waits on a time
// (parking), for brokers without native hold.

// forget drops an item from the outstanding set and gives back its token.
func (s *Subscriber) forget(it *item) {
	s.mu.Lock()
	delete(s.outstanding, it)
	tok := it.hasToken
	it.hasToken = false
	s.mu.Unlock()
	if tok {
		s.releaseTokens(1)
	}
}

// park gives back the token of an item that waits in process for its retry.
// Under holdKeys it parks the item's key: the key's items already received
// wait behind it and give back their tokens too.
func (s *Subscriber) park(it *item) {
	free := 0
	s.mu.Lock()
	if it.hasToken {
		it.hasToken = false
		free++
	}
	if key := it.m.Key; s.holdKeys && key != "" {
		it.parked = true
		s.parked[key]++
		for o := range s.outstanding {
			if o.hasToken && o.m.Key == key {
				o.hasToken = false
				free++
			}
		}
	}
	s.mu.Unlock()
	s.releaseTokens(free)
}

// unpark is called when a parked item's time has come.
func (s *Subscriber) unpark(it *item) {
	key := it.m.Key
	s.mu.Lock()
	it.parked = false
	if s.parked[key]--; s.parked[key] <= 0 {
		delete(s.parked, key)
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
	s.forget(it)
}
