package model

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
)

// Instance is one consumer process's view of a model broker: its
// subscription driver is Driver. Instances of one broker share its
// messages; a key is held by one instance at a time.
type Instance struct {
	b     *Broker
	id    int
	crash chan struct{}

	mu      sync.Mutex
	revoke  func(ctx context.Context, selected func(*driver.Message) bool) []*driver.Message
	crashed bool

	// Guarded by the broker's mu: the revocations from this instance
	// (Broker.Revoke), and a count of their starts and ends.
	revoking []*revoking
	revokes  uint64
	// down: Crash was called (read under the broker's mu, which Crashed's
	// i.mu may not be taken under).
	down bool
}

// revoking is a Broker.Revoke: from its start until the broker takes the
// leases back, a Receive of the instance begun after its start returns
// none of the keys it selects; once they are taken back, a Receive begun
// before then returns nothing more (see Broker.Revoke).
type revoking struct {
	n        uint64 // the instance's revokes as it began
	done     uint64 // the instance's revokes as the leases were taken back; 0 before
	selected func(key string) bool
}

// withheld reports whether a Receive of i begun when i.revokes was began
// must not return a message of key: a revocation selecting it began since
// and is under way. The broker's mu is held.
func (i *Instance) withheld(key string, began uint64) bool {
	for _, r := range i.revoking {
		if r.done == 0 && r.n <= began && r.selected(key) {
			return true
		}
	}
	return false
}

// interrupted reports whether a Receive of i begun when i.revokes was
// began must end: a revocation took its leases back since. The broker's mu
// is held.
func (i *Instance) interrupted(began uint64) bool {
	for _, r := range i.revoking {
		if r.done > began {
			return true
		}
	}
	return false
}

// NewInstance returns a new consumer process on the broker.
func (b *Broker) NewInstance() *Instance {
	b.mu.Lock()
	b.nInst++
	id := b.nInst
	b.mu.Unlock()
	return &Instance{b: b, id: id, crash: make(chan struct{})}
}

// ID numbers the broker's instances from 1, in the order they were made.
func (i *Instance) ID() int { return i.id }

// Crash loses the instance as a crashed process is lost: from now on
// every call of its driver fails with ErrCrashed and takes no effect, and
// its leases run out unsettled (each counts an attempt when its message
// may have been running).
func (i *Instance) Crash() {
	i.mu.Lock()
	if !i.crashed {
		i.crashed = true
		close(i.crash)
	}
	i.mu.Unlock()
	i.b.mu.Lock()
	i.down = true
	i.b.mu.Unlock()
}

// DeliveryHeader is the header each delivery of the model carries: the
// number of its lease, one per delivery. Two deliveries of one message
// held by one instance (a redelivery received while the first, whose lease
// was taken back unreported, still waits or runs) tell apart by it.
const DeliveryHeader = "model-delivery"

// HoldsDelivery reports whether the instance holds the live lease of the
// delivery whose headers these are (DeliveryHeader): Holds for that very
// delivery, not for any of its message. A run of a delivery the broker
// took back does not count as holding the message because a later
// delivery of it is leased here (seed 2505 by default: m004's lost
// delivery ran at attempt 2 while its redelivery, at attempt 2 too, was
// leased, and the check counted that run as one the redelivery should
// have counted).
func (i *Instance) HoldsDelivery(headers map[string]string) bool {
	n, ok := headers[DeliveryHeader]
	if !ok {
		return false
	}
	b := i.b
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expire(time.Now())
	for _, l := range b.leases {
		if l.inst == i && strconv.FormatUint(l.id, 10) == n {
			return true
		}
	}
	return false
}

// Holds reports whether the instance holds a live lease of the message
// with this ID. A test's handler asks it as a run starts: a run on a lease
// the broker took back unreported (renewals stalled, or lost with an
// earlier delivery of its key) may overlap a run of another instance,
// which no consumer can prevent.
func (i *Instance) Holds(id string) bool {
	b := i.b
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expire(time.Now())
	for _, l := range b.leases {
		if l.inst == i && l.r.msg.ID == id {
			return true
		}
	}
	return false
}

// Crashed reports whether Crash was called.
func (i *Instance) Crashed() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.crashed
}

// Driver returns the instance's subscription driver. It implements
// driver.StartRecorder, driver.Returner and driver.Revocable as the
// broker's Config says, and no other optional interface.
func (i *Instance) Driver() driver.Subscription {
	c := i.b.cfg
	s, r, v := starter{i}, returner{i}, revocable{i}
	switch {
	case c.StartRecorder && c.Returner && c.Revocable:
		return struct {
			*Instance
			starter
			returner
			revocable
		}{i, s, r, v}
	case c.StartRecorder && c.Returner:
		return struct {
			*Instance
			starter
			returner
		}{i, s, r}
	case c.StartRecorder && c.Revocable:
		return struct {
			*Instance
			starter
			revocable
		}{i, s, v}
	case c.Returner && c.Revocable:
		return struct {
			*Instance
			returner
			revocable
		}{i, r, v}
	case c.StartRecorder:
		return struct {
			*Instance
			starter
		}{i, s}
	case c.Returner:
		return struct {
			*Instance
			returner
		}{i, r}
	case c.Revocable:
		return struct {
			*Instance
			revocable
		}{i, v}
	}
	return i
}

// call draws a call's fault: whether the call takes effect, and the error
// it answers. A timed-out call waits first.
func (i *Instance) call(ctx context.Context, op string) (effect bool, err error) {
	if i.Crashed() {
		return false, ErrCrashed
	}
	b := i.b
	b.mu.Lock()
	f := b.cfg.Faults
	x := b.rnd.Float64()
	withEffect := b.rnd.IntN(2) == 0
	b.mu.Unlock()
	switch {
	case x < f.Fail:
		return false, fmt.Errorf("%s: %w", op, ErrTransient)
	case x < f.Fail+f.FailAfterEffect:
		return true, fmt.Errorf("%s, after taking effect: %w", op, ErrTransient)
	case x < f.Fail+f.FailAfterEffect+f.Timeout:
		t := time.NewTimer(f.TimeoutAfter)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		case <-i.crash:
			return false, ErrCrashed
		}
		return withEffect, fmt.Errorf("%s timed out (effect %v): %w", op, withEffect, ErrTransient)
	}
	return true, nil
}

// Receive implements driver.Subscription.
func (i *Instance) Receive(ctx context.Context, maxMessages int) ([]*driver.Message, error) {
	b := i.b
	if maxMessages <= 0 || maxMessages > b.cfg.MaxBatch {
		maxMessages = b.cfg.MaxBatch
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	b.mu.Lock()
	began := i.revokes // revocations begun before this Receive
	b.mu.Unlock()
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		effect, err := i.call(ctx, "receive")
		if err != nil && !b.cfg.NativeHold {
			// A streaming broker's later messages of a key would reach the
			// consumer without the earlier ones of the lost answer, which
			// the contract does not allow: the failure has no effect.
			effect = false
		}
		if !effect {
			return nil, err
		}
		b.mu.Lock()
		if i.interrupted(began) {
			b.mu.Unlock()
			return nil, fmt.Errorf("receive: interrupted by a revocation: %w", ErrTransient)
		}
		now := time.Now()
		b.expire(now)
		out := b.take(i, maxMessages, now, began)
		if len(out) > 0 || err != nil {
			if err != nil {
				// The leases were taken, the answer lost: they run out.
				for _, m := range out {
					m.AckID.(*lease).unseen = true
				}
				b.mu.Unlock()
				return nil, err
			}
			b.mu.Unlock()
			return out, nil
		}
		wake, ok := b.nextWake(now)
		ch := b.changed
		b.mu.Unlock()
		var tc <-chan time.Time
		if ok {
			if timer == nil {
				timer = time.NewTimer(wake.Sub(now))
			} else {
				timer.Reset(wake.Sub(now))
			}
			tc = timer.C
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-i.crash:
		case <-ch:
		case <-tc:
		}
	}
}

// settle applies fn to the live lease of each message, in order; a message
// whose lease is gone makes the call answer ErrLeaseLost.
func (i *Instance) settle(ctx context.Context, op string, ms []*driver.Message, fn func(l *lease, now time.Time)) error {
	effect, err := i.call(ctx, op)
	b := i.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if !effect {
		b.trace("%s of %d messages from instance %d failed without effect: %v", op, len(ms), i.id, err)
		b.settledNot(op, ms)
		return err
	}
	now := time.Now()
	b.expire(now)
	if len(ms) > 0 && b.chance(b.cfg.Faults.LoseOnSettle) {
		if l := i.live(ms[0]); l != nil {
			b.lose(l)
		}
	}
	var lost error
	for _, m := range ms {
		l := i.live(m)
		if l == nil {
			if lost == nil {
				lost = fmt.Errorf("%s %s: %w", op, m.ID, ErrLeaseLost)
			}
			b.trace("%s of %s from instance %d: lease lost", op, m.ID, i.id)
			b.settledNot(op, []*driver.Message{m})
			continue
		}
		b.trace("%s of %s from instance %d", op, m.ID, i.id)
		fn(l, now)
	}
	b.signal()
	if err != nil {
		return err
	}
	return lost
}

// settledNot tells the Settled hook that op did not take effect for ms;
// b.mu is held.
func (b *Broker) settledNot(op string, ms []*driver.Message) {
	if f := b.cfg.Settled; f != nil && (op == "ack" || op == "dead-letter") {
		for _, m := range ms {
			f(op, m.ID, false)
		}
	}
}

// live returns m's lease if this instance still holds it; b.mu is held.
func (i *Instance) live(m *driver.Message) *lease {
	l, _ := m.AckID.(*lease)
	if l == nil || l.inst != i || i.b.leases[l.id] != l {
		return nil
	}
	return l
}

// Ack implements driver.Subscription.
func (i *Instance) Ack(ctx context.Context, ms []*driver.Message) error {
	return i.settle(ctx, "ack", ms, func(l *lease, _ time.Time) {
		i.b.drop(l)
		if !l.dup {
			l.r.acked = true
			i.b.ackedIDs[l.r.msg.ID] = true
			if f := i.b.cfg.Settled; f != nil {
				f("ack", l.r.msg.ID, true)
			}
		}
	})
}

// Nack implements driver.Subscription: the message is deliverable again
// not before delay, its attempt counted (with StartRecorder, the start
// counted it).
func (i *Instance) Nack(ctx context.Context, m *driver.Message, delay time.Duration) error {
	return i.settle(ctx, "nack", []*driver.Message{m}, func(l *lease, now time.Time) {
		i.b.drop(l)
		if l.dup {
			return
		}
		if !i.b.cfg.StartRecorder {
			l.r.attempts++
		}
		l.r.notBefore = now.Add(delay)
	})
}

// Release implements driver.Subscription: the messages are deliverable
// again at once, uncounted. Without NativeHold and with
// Faults.LoseWithLater, the instance's later deliveries of their keys go
// back with them, unreported (as a Pub/Sub nack redelivers a key's later
// messages); without LoseWithLater they stay leased.
func (i *Instance) Release(ctx context.Context, ms []*driver.Message) error {
	return i.settle(ctx, "release", ms, func(l *lease, _ time.Time) {
		b := i.b
		b.drop(l)
		if b.cfg.NativeHold || !b.cfg.Faults.LoseWithLater || l.dup || l.r.msg.Key == "" {
			return
		}
		for _, o := range b.recs[l.r.seq+1:] {
			if o.msg.Key == l.r.msg.Key && o.lease != nil && o.lease.inst == i {
				b.trace("lease of %s (instance %d) released with %s", o.msg.ID, i.id, l.r.msg.ID)
				b.drop(o.lease)
				o.lost++ // uncounted: taken back unreported
			}
		}
	})
}

// ExtendLeases implements driver.Subscription.
func (i *Instance) ExtendLeases(ctx context.Context, ms []*driver.Message) ([]*driver.Message, error) {
	effect, err := i.call(ctx, "extend")
	if !effect {
		return nil, err
	}
	b := i.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.chance(b.cfg.Faults.StallRenewals) {
		return nil, err
	}
	now := time.Now()
	b.expire(now)
	var lost []*driver.Message
	for _, m := range ms {
		if l := i.live(m); l != nil && b.chance(b.cfg.Faults.LoseLease) {
			b.lose(l)
		}
	}
	// Decided after the draws: with LoseWithLater a loss takes later
	// deliveries named earlier in ms too, reported in this answer.
	for _, m := range ms {
		l := i.live(m)
		if l == nil {
			lost = append(lost, m)
			continue
		}
		l.deadline = now.Add(b.cfg.LeaseDuration)
	}
	if err != nil {
		return nil, err
	}
	return lost, nil
}

// DeadLetter implements driver.Subscription.
func (i *Instance) DeadLetter(ctx context.Context, m *driver.Message, reason string, attempts int) error {
	return i.settle(ctx, "dead-letter", []*driver.Message{m}, func(l *lease, now time.Time) {
		i.b.drop(l)
		r := l.r
		if !r.acked && !r.dead {
			r.dead = true
			i.b.dead = append(i.b.dead, driver.DeadLetter{Message: r.msg, Reason: reason, Attempts: attempts, DeadAt: now})
			if f := i.b.cfg.Settled; f != nil {
				f("dead-letter", r.msg.ID, true)
			}
		}
	})
}

// Capabilities implements driver.Subscription.
func (i *Instance) Capabilities() driver.Capabilities { return i.b.Capabilities() }

// ReleaseRedelivers implements driver.ReleaseRedeliverer: a released
// message is deliverable again at once, and a streaming key's messages go
// out in key order.
func (i *Instance) ReleaseRedelivers() bool { return true }

// IsRetryable implements driver.Subscription: injected failures are.
func (i *Instance) IsRetryable(err error) bool { return topic{}.IsRetryable(err) }

// ErrorCode implements driver.Subscription.
func (i *Instance) ErrorCode(err error) keyorder.ErrorCode { return code(err) }

// Close implements driver.Subscription: unsettled leases run out.
func (i *Instance) Close() error { return nil }

type starter struct{ i *Instance }

// Started implements driver.StartRecorder: each start counts an attempt.
// It never fails.
func (s starter) Started(_ context.Context, ms []*driver.Message) error {
	if s.i.Crashed() {
		return ErrCrashed
	}
	b := s.i.b
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range ms {
		// A start counts even when the delivery's lease is gone
		// unreported: the handler runs the message all the same.
		if l, _ := m.AckID.(*lease); l != nil && l.inst == s.i && !l.dup {
			l.r.attempts++
		}
	}
	return nil
}

type returner struct{ i *Instance }

// Return implements driver.Returner: each message is deliverable again
// not before its NotBefore, with its Attempts. It never fails but for a
// lease already lost.
func (r returner) Return(_ context.Context, rs []driver.Returned) error {
	if r.i.Crashed() {
		return ErrCrashed
	}
	b := r.i.b
	b.mu.Lock()
	defer b.mu.Unlock()
	var lost error
	for _, x := range rs {
		l := r.i.live(x.Message)
		if l == nil {
			if lost == nil {
				lost = fmt.Errorf("return %s: %w", x.Message.ID, ErrLeaseLost)
			}
			continue
		}
		b.drop(l)
		if !l.dup {
			l.r.attempts = x.Attempts
			l.r.notBefore = x.NotBefore
		}
	}
	b.signal()
	return lost
}

type revocable struct{ i *Instance }

// SetRevoke implements driver.Revocable.
func (v revocable) SetRevoke(revoke func(ctx context.Context, selected func(*driver.Message) bool) []*driver.Message) {
	v.i.mu.Lock()
	v.i.revoke = revoke
	v.i.mu.Unlock()
}
