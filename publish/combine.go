package publish

// This file: combined sends, for drivers that take several keys in one
// call (driver.MixedKeySender; see "Combined sends" in the package
// documentation). Keys are queued as with any driver; instead of one
// sender goroutine per key, a key with messages queued and no batch in
// flight waits in Publisher.ready, and up to CombinedSendsInFlight senders
// each take the ready keys, oldest first, into one call.

import (
	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
)

// combined is one send that carries the batches of several keys.
type combined struct {
	keys  []*keyQueue       // the keys in the send
	batch []*request        // their requests, key after key, each key's in order
	ms    []*driver.Message // the driver's slice (reused)
}

// readyLocked puts kq in p.ready if it has messages queued and is neither
// in a send nor lingering nor ready already; p.mu is held.
func (p *Publisher) readyLocked(kq *keyQueue) {
	if kq.inCall || kq.lingering || kq.isReady || len(kq.pending) == 0 {
		return
	}
	kq.isReady = true
	p.ready = append(p.ready, kq)
}

// readyLen is how many keys are ready; p.mu is held.
func (p *Publisher) readyLen() int { return len(p.ready) - p.readyHead }

// popReadyLocked removes the oldest ready key; p.mu is held.
func (p *Publisher) popReadyLocked() {
	p.ready[p.readyHead] = nil
	p.readyHead++
	switch {
	case p.readyHead == len(p.ready):
		p.ready, p.readyHead = p.ready[:0], 0
	case p.readyHead >= 256 && p.readyHead*2 >= len(p.ready):
		// Under sustained load the queue may never empty: move what is
		// left to the front rather than grow the array forever.
		n := copy(p.ready, p.ready[p.readyHead:])
		clear(p.ready[n:])
		p.ready, p.readyHead = p.ready[:n], 0
	}
}

// startSendsLocked starts combined sends of the ready keys while fewer than
// CombinedSendsInFlight are in flight; p.mu is held.
func (p *Publisher) startSendsLocked() {
	for p.readyLen() > 0 && p.calls < CombinedSendsInFlight {
		c := &combined{}
		p.takeLocked(c)
		p.calls++
		p.senders.Add(1)
		go p.sendCombined(c)
	}
}

// takeLocked moves the queued messages of the ready keys, oldest key
// first, into c until it holds Config.MaxBatch messages or the next would
// break the backend's byte limit (a send holds at least one message). A
// key whose queue does not fit whole sends its first messages; the rest
// waits for the key's next send. p.mu is held.
func (p *Publisher) takeLocked(c *combined) {
	bytes := 0
	for p.readyLen() > 0 && len(c.batch) < p.cfg.MaxBatch {
		kq := p.ready[p.readyHead]
		n := min(len(kq.pending), p.cfg.MaxBatch-len(c.batch))
		if lim := p.limits.MaxBatchBytes; lim > 0 {
			fit := 0
			for _, r := range kq.pending[:n] {
				if bytes+len(r.m.Payload) > lim && len(c.batch)+fit > 0 {
					break
				}
				bytes += len(r.m.Payload)
				fit++
			}
			n = fit
		}
		if n == 0 {
			return
		}
		p.popReadyLocked()
		kq.isReady, kq.inCall = false, true
		c.keys = append(c.keys, kq)
		c.batch = append(c.batch, kq.pending[:n]...)
		if n == len(kq.pending) {
			clear(kq.pending)
			kq.pending = kq.pending[:0]
		} else {
			kq.pending = kq.pending[n:]
		}
	}
}

// sendCombined sends c, settles it, and goes on with the keys ready then
// until none is; it holds one of the CombinedSendsInFlight places
// throughout.
func (p *Publisher) sendCombined(c *combined) {
	defer p.senders.Done()
	for {
		err := p.send(c.batch, &c.ms)
		first, nkeys := c.keys[0].key, len(c.keys) // for the log: settle may reuse the queues
		p.mu.Lock()
		p.settleLocked(c, err)
		p.mu.Unlock()
		for _, r := range c.batch {
			r.finish(err)
		}
		if err != nil {
			p.cfg.Logger.Warn("keyorder: keyed publish failed", "key", first, "keys", nkeys, "paused", !p.cfg.AutoResume, "err", err)
		}
		clear(c.batch)
		c.batch = c.batch[:0]
		clear(c.keys)
		c.keys = c.keys[:0]
		p.mu.Lock()
		if p.readyLen() > 0 {
			p.takeLocked(c)
		}
		if len(c.batch) == 0 {
			p.calls--
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
	}
}

// settleLocked records the outcome of c's send, before its callers hear
// of it; p.mu is held. A failed send fails every key in it as sendKey
// fails a key's batch: the key is paused (unless Config.AutoResume), and
// what queued behind the batch, or waits to be admitted with a message of
// the key, fails with a *keyorder.KeyPausedError. Then each key is ready
// again if messages are queued for it, else forgotten; the messages'
// share of the outstanding limits is released.
func (p *Publisher) settleLocked(c *combined, err error) {
	settled, bytes := len(c.batch), 0
	for _, r := range c.batch {
		bytes += r.size
	}
	if err != nil {
		for _, kq := range c.keys {
			if !p.cfg.AutoResume {
				p.paused[kq.key] = err
			}
			perr := &keyorder.KeyPausedError{Key: kq.key, Cause: err}
			for _, r := range kq.pending {
				settled++
				bytes += r.size
				r.finish(perr)
			}
			clear(kq.pending)
			kq.pending = kq.pending[:0]
			p.failWaitingLocked(kq.key, perr)
		}
	}
	for _, kq := range c.keys {
		kq.inCall = false
		if len(kq.pending) == 0 {
			p.dropKeyLocked(kq)
		} else {
			p.readyLocked(kq)
		}
	}
	p.releaseLocked(settled, bytes)
	p.startSendsLocked()
}

// lingerKey waits out Config.Linger for a new key's first batch (see
// linger), then makes the key ready for a combined send.
func (p *Publisher) lingerKey(kq *keyQueue) {
	defer p.senders.Done()
	p.linger(kq)
	p.mu.Lock()
	kq.lingering = false
	p.readyLocked(kq)
	p.startSendsLocked()
	p.mu.Unlock()
}
