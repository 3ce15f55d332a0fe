package publish

import (
	"context"
	"slices"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
)

// Result is the outcome of one PublishAsync, in the shape of the Pub/Sub
// client's PublishResult: Ready is closed when the outcome is known, and
// Get waits for it.
type Result struct {
	ready chan struct{}
	id    string
	err   error
	req   request     // the queued message
	one   [1]*request // &req, so admitting one message allocates nothing
}

// Ready returns a channel that is closed when the message has settled:
// the broker has it, or publishing it failed.
func (r *Result) Ready() <-chan struct{} { return r.ready }

// Get waits until the message has settled or ctx ends. It returns the
// message's ID (Message.ID, or the UUIDv7 the publisher assigned) and nil
// once the broker has the message. On failure the error is typed as
// Publish documents it; the ID is still returned when the message was
// queued (a broker error may leave the message stored) and is "" when
// nothing was queued (an invalid message, a paused key, a closed
// publisher, a context that ended before the message was admitted). If ctx
// ends first, Get returns the ID and ctx.Err(); the message is still sent
// in its place, and Get may be called again.
func (r *Result) Get(ctx context.Context) (id string, err error) {
	select {
	case <-r.ready:
		return r.id, r.err
	default:
	}
	select {
	case <-r.ready:
		return r.id, r.err
	case <-ctx.Done():
		return r.id, ctx.Err()
	}
}

// settle records the outcome and closes ready.
func (r *Result) settle(err error) {
	r.err = err
	close(r.ready)
}

// refuse settles a Result whose message was never queued.
func (r *Result) refuse(err error) *Result {
	r.id = ""
	r.settle(err)
	return r
}

// PublishAsync queues m to be sent and returns its Result without waiting
// for the broker. It keeps every guarantee of Publish: m is validated (and
// its key resolved) before anything is sent, a key's messages reach the
// broker in the order PublishAsync accepted them, with one batch per key in
// flight and what queued meanwhile batched behind it; a failed batch pauses
// its key and fails everything queued behind it with an error matching
// keyorder.ErrKeyPaused. m is not modified and not retained: the message
// sent is a copy, with its own copy of the payload and of the headers map
// taken before PublishAsync returns, so the caller may reuse m, its
// Payload buffer and its Headers map at once; a UUIDv7 is assigned to the
// copy when m.ID is empty, and Result.Get returns it.
//
// PublishAsync blocks only while the publisher holds
// Config.MaxOutstandingMessages messages or Config.MaxOutstandingBytes bytes
// not yet settled, and behind publishes already blocked (FIFO); ctx bounds
// that wait only: when it ends first, the Result fails with ctx.Err() and
// nothing is sent. Once PublishAsync has returned, the message is sent
// whatever becomes of ctx. Errors known at once (an invalid message, a
// paused key, a closed publisher, a done ctx) come back in a Result that is
// already settled.
func (p *Publisher) PublishAsync(ctx context.Context, m *keyorder.Message) *Result {
	r := &Result{ready: make(chan struct{})}
	if err := ctx.Err(); err != nil {
		return r.refuse(err)
	}
	if err := p.prepare(&r.req, m); err != nil {
		return r.refuse(err)
	}
	r.id = r.req.m.ID
	r.req.size, r.req.res = msgSize(r.req.m), r
	r.one[0] = &r.req
	p.ownPayloads(r.one[:])
	if p.cfg.Observer != nil {
		if err := p.observe(ctx, r.one[:]); err != nil {
			return r.refuse(err)
		}
	}
	if err := p.admit(ctx, r.one[:]); err != nil {
		return r.refuse(endAll(r.one[:], err))
	}
	return r
}

// flow is the outstanding-message accounting; guarded by Publisher.mu.
type flow struct {
	msgs, bytes int
	waiting     []*waiter // blocked publishes, oldest first
}

// waiter is a publish blocked on the outstanding limits.
type waiter struct {
	rs   []*request
	size int
	done chan struct{} // closed (under Publisher.mu) once admitted or failed
	err  error         // why it was failed; nil when admitted
}

// msgSize is what a message counts against MaxOutstandingBytes.
func msgSize(m *driver.Message) int {
	n := len(m.Payload) + len(m.Key) + len(m.ID)
	for k, v := range m.Headers {
		n += len(k) + len(v)
	}
	return n
}

// fitsLocked reports whether n messages of size bytes may be admitted now.
// Something too large for a limit fits once nothing is outstanding.
func (p *Publisher) fitsLocked(n, size int) bool {
	if p.flow.msgs == 0 {
		return true
	}
	if lim := p.cfg.MaxOutstandingMessages; lim >= 0 && p.flow.msgs+n > lim {
		return false
	}
	if lim := p.cfg.MaxOutstandingBytes; lim >= 0 && p.flow.bytes+size > lim {
		return false
	}
	return true
}

// admit queues rs (one call's requests) as one unit, after the publishes
// already blocked and once the outstanding limits allow; it returns an
// error, having queued nothing, if the publisher is closed, one of the
// keys is paused, or ctx ends first.
func (p *Publisher) admit(ctx context.Context, rs []*request) error {
	size := 0
	for _, r := range rs {
		size += r.size
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return keyorder.ErrClosed
	}
	// Check every key before queueing any, so a paused key fails the call
	// without half of it sent.
	if err := p.pausedLocked(rs); err != nil {
		p.mu.Unlock()
		return err
	}
	if len(p.flow.waiting) == 0 && p.fitsLocked(len(rs), size) {
		p.queueLocked(rs)
		p.mu.Unlock()
		return nil
	}
	w := &waiter{rs: rs, size: size, done: make(chan struct{})}
	p.flow.waiting = append(p.flow.waiting, w)
	p.mu.Unlock()
	select {
	case <-w.done:
		return w.err
	case <-ctx.Done():
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-w.done: // admitted (or failed) while ctx ended: that stands
		return w.err
	default:
	}
	i := slices.Index(p.flow.waiting, w)
	p.flow.waiting = slices.Delete(p.flow.waiting, i, i+1)
	if i == 0 {
		p.admitLocked() // the next one may fit where w did not
	}
	return ctx.Err()
}

// releaseLocked returns settled messages' share of the limits and admits
// what now fits; p.mu is held.
func (p *Publisher) releaseLocked(n, size int) {
	p.flow.msgs -= n
	p.flow.bytes -= size
	p.admitLocked()
}

// admitLocked admits blocked publishes in order while they fit; p.mu is
// held.
func (p *Publisher) admitLocked() {
	if p.closed {
		return
	}
	for len(p.flow.waiting) > 0 {
		w := p.flow.waiting[0]
		if err := p.pausedLocked(w.rs); err != nil {
			w.err = err
		} else if p.fitsLocked(len(w.rs), w.size) {
			p.queueLocked(w.rs)
		} else {
			return
		}
		p.flow.waiting[0] = nil
		p.flow.waiting = p.flow.waiting[1:]
		close(w.done)
	}
	p.flow.waiting = nil // let the backing array go
}

// failWaitingLocked fails the blocked publishes that hold a message of key
// (all of them when key is "") with err; p.mu is held. They were called
// before the failure that pauses key was known, so sending them would let
// them overtake the failed message.
func (p *Publisher) failWaitingLocked(key string, err error) {
	if len(p.flow.waiting) == 0 {
		return
	}
	p.flow.waiting = slices.DeleteFunc(p.flow.waiting, func(w *waiter) bool {
		if key != "" && !slices.ContainsFunc(w.rs, func(r *request) bool { return r.m.Key == key }) {
			return false
		}
		w.err = err
		close(w.done)
		return true
	})
	p.admitLocked()
}

// ownPayloads gives the driver messages of rs copies of the caller's
// payloads, cut from one buffer, so that nothing the caller passed is
// retained: a publish may return (PublishAsync at once, Publish and
// PublishBatch when their context ends) while its messages wait to be sent,
// and the caller may then reuse its buffers. Each copy's capacity is its
// length, so the copies do not overlap. (driver.Prepare already copied
// the headers map.) Small buffers are cut from chunks shared by the
// publisher's messages (see payloadChunk).
func (p *Publisher) ownPayloads(rs []*request) {
	total := 0
	for _, r := range rs {
		total += len(r.m.Payload)
	}
	var buf []byte
	if total > 0 {
		p.payloadsMu.Lock()
		buf = p.payloads.Cut(total)
		p.payloadsMu.Unlock()
	}
	for _, r := range rs {
		pl := r.m.Payload
		if len(pl) == 0 {
			r.m.Payload = pl[:0:0] // nil stays nil, empty stays empty
			continue
		}
		n := copy(buf, pl)
		r.m.Payload = buf[:n:n]
		buf = buf[n:]
	}
}
