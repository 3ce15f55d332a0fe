package drivertest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/subscribe"
)

// redriveAfterDeadLetterError: a DeadLetter call that took effect but
// returned an error (the broker stored the dead letter; its answer was
// lost) leaves the subscriber a note to dead-letter a redelivery of the
// message unrun, in case the call had not taken effect. The message is a
// dead letter, though, and comes back only redriven: redriven by another
// process (as `keyorder dead redrive` does), it is a new copy
// (driver.Message.Copy) with a fresh attempt count, and it runs.
func redriveAfterDeadLetterError(f *fixture) {
	p := f.publisher(nil)
	f.publish(p, "c1:C", "c2:C")
	drv := &deadLetterAnswerLost{Subscription: &copyLog{Subscription: f.consumer()}}
	f.subscribeOn(drv, &subscribe.Config{Workers: 2}, failOnce("c1", keyorder.Permanent(errors.New("account closed"))))
	f.waitFor(20, "c2 handled", func() bool { return slices.Contains(f.rec.succeeded("C"), "c2") })
	if !drv.failed.Load() {
		f.t.Fatalf("c1 was not dead-lettered\n%s", f.rec.dump())
	}
	// Another process redrives it. It leaves at once: on a broker that
	// pushes messages to its consumers (Pulsar) it would otherwise be
	// handed the redriven c1 and hold it.
	other := f.consumer()
	store, ok := other.(driver.DeadLetterStore)
	if !ok {
		other.Close()
		f.t.Skipf("group order checked; the backend keeps no dead letters it can redrive")
	}
	dl, err := store.DeadLetters(f.ctx, 10)
	if err != nil || len(dl) != 1 || string(dl[0].Message.Payload) != "c1" {
		other.Close()
		f.t.Fatalf("dead letters = %+v, %v; want c1 (its DeadLetter call took effect)", dl, err)
	}
	n, err := store.Redrive(f.ctx, []string{dl[0].Message.ID})
	other.Close()
	if err != nil || n != 1 {
		f.t.Fatalf("Redrive = %d, %v", n, err)
	}
	f.waitFor(40, "redriven c1 handled", func() bool { return slices.Contains(f.rec.succeeded("C"), "c1") })
	if got, want := f.rec.starts("C"), []string{"c1", "c2", "c1"}; !slices.Equal(got, want) {
		f.t.Fatalf("group C handled %v, want %v (the redriven c1 runs)", got, want)
	}
	if e, _ := f.rec.firstEvent(func(e event) bool { return !e.start && e.name == "c1" && e.err == nil }); e.attempt != 1 {
		f.t.Errorf("redriven c1 ran at attempt %d, want 1 (a fresh count)", e.attempt)
	}
	drv.mu.Lock()
	first := drv.dead
	drv.mu.Unlock()
	if again := drv.Subscription.(*copyLog).last("c1"); first != nil && again == first {
		f.t.Errorf("redriven c1 delivered with the Copy of the dead-lettered one (%v): driver.Message.Copy must "+
			"tell a redriven message from a redelivery", first)
	}
	ctx, cancel := context.WithTimeout(f.ctx, time.Minute)
	defer cancel()
	last := f.consumer()
	dl, err = last.(driver.DeadLetterStore).DeadLetters(ctx, 10)
	last.Close()
	if err != nil || len(dl) != 0 {
		f.t.Fatalf("dead letters after the redrive = %+v, %v; want none", dl, err)
	}
}

// errAnswerLost is deadLetterAnswerLost's injected error.
var errAnswerLost = errors.New("injected: the dead letter was stored; the broker's answer was lost")

// deadLetterAnswerLost wraps a driver so that its first DeadLetter call
// takes effect and then fails with a permanent error, as when the broker
// acted and its answer was lost on the way back. It is fault injection at
// the driver boundary, not a fake broker.
type deadLetterAnswerLost struct {
	driver.Subscription
	failed atomic.Bool
	mu     sync.Mutex
	dead   any // the Copy of the message of the call that failed
}

// DeadLetter dead-letters m, and reports the first call failed.
func (d *deadLetterAnswerLost) DeadLetter(ctx context.Context, m *driver.Message, reason string, attempts int) error {
	if err := d.Subscription.DeadLetter(ctx, m, reason, attempts); err != nil {
		return err
	}
	if d.failed.CompareAndSwap(false, true) {
		d.mu.Lock()
		d.dead = m.Copy
		d.mu.Unlock()
		return errAnswerLost
	}
	return nil
}

// ReleaseRedelivers forwards driver.ReleaseRedeliverer.
func (d *deadLetterAnswerLost) ReleaseRedelivers() bool { return releaseRedelivers(d.Subscription) }

// ReleaseRedelivers forwards driver.ReleaseRedeliverer.
func (c *copyLog) ReleaseRedelivers() bool { return releaseRedelivers(c.Subscription) }

// releaseRedelivers reports whether drv is a driver.ReleaseRedeliverer
// that says so.
func releaseRedelivers(drv driver.Subscription) bool {
	r, ok := drv.(driver.ReleaseRedeliverer)
	return ok && r.ReleaseRedelivers()
}

// IsRetryable reports the injected error permanent, so the subscriber
// gives the call up at once.
func (d *deadLetterAnswerLost) IsRetryable(err error) bool {
	return !errors.Is(err, errAnswerLost) && d.Subscription.IsRetryable(err)
}

// copyLog wraps a driver to record the driver.Message.Copy of each
// delivery, by payload.
type copyLog struct {
	driver.Subscription
	mu     sync.Mutex
	copies map[string][]any
}

// Receive receives and records.
func (c *copyLog) Receive(ctx context.Context, max int) ([]*driver.Message, error) {
	ms, err := c.Subscription.Receive(ctx, max)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.copies == nil {
		c.copies = map[string][]any{}
	}
	for _, m := range ms {
		c.copies[string(m.Payload)] = append(c.copies[string(m.Payload)], m.Copy)
	}
	return ms, err
}

// first returns the Copy of name's first delivery, last of its last; nil
// when it was not delivered.
func (c *copyLog) first(name string) any { return c.at(name, 0) }
func (c *copyLog) last(name string) any  { return c.at(name, -1) }

func (c *copyLog) at(name string, i int) any {
	c.mu.Lock()
	defer c.mu.Unlock()
	cs := c.copies[name]
	if len(cs) == 0 {
		return nil
	}
	if i < 0 {
		i += len(cs)
	}
	return cs[i]
}

// redriveNotDeadLetters: Redrive given IDs that are not dead letters of
// the subscription (a message that was acknowledged, an ID never
// published, a dead letter already redriven) redrives the others and
// fails with a *keyorder.NotDeadLetterError (matching ErrNotFound) naming
// those, each once, in the order given; it does not return (n, nil) as if
// all were redriven. Checked through the Subscriber and on a driver of
// another process (as `keyorder dead redrive` calls it).
func redriveNotDeadLetters(f *fixture) {
	p := f.publisher(nil)
	f.publish(p, "n1:N", "n2:N")
	r := f.subscribe(&subscribe.Config{Workers: 2}, failOnce("n1", keyorder.Permanent(errors.New("bad"))))
	f.waitFor(20, "n2 handled", func() bool { return slices.Contains(f.rec.succeeded("N"), "n2") })
	dead, acked, unknown := f.t.Name()+"/n1", f.t.Name()+"/n2", f.t.Name()+"/never-published"
	var deadID string
	f.waitFor(20, "n1 dead-lettered", func() bool {
		got, err := r.sub.DeadLetters(f.ctx, 0)
		if err != nil {
			f.t.Fatalf("DeadLetters: %v", err)
		}
		if len(got) == 1 {
			deadID = got[0].Message.ID
		}
		return len(got) == 1
	})
	if deadID != dead {
		f.t.Fatalf("dead letter %q, want %q", deadID, dead)
	}
	check := func(who string, n, wantN int, err error, want ...string) {
		f.t.Helper()
		var nd *keyorder.NotDeadLetterError
		if n != wantN || !errors.As(err, &nd) || !errors.Is(err, keyorder.ErrNotFound) || !slices.Equal(nd.IDs, want) {
			f.t.Fatalf("%s = %d, %v; want %d and a NotDeadLetterError naming %q", who, n, err, wantN, want)
		}
	}
	n, err := r.sub.Redrive(f.ctx, []string{acked, dead, unknown, acked})
	check("Subscriber.Redrive(acked, dead, unknown, acked)", n, 1, err, acked, unknown)
	f.waitFor(40, "redriven n1 handled", func() bool { return slices.Contains(f.rec.succeeded("N"), "n1") })
	// Redriven already: no longer a dead letter, on any consumer.
	n, err = r.sub.Redrive(f.ctx, []string{dead})
	check("Subscriber.Redrive(redriven)", n, 0, err, dead)
	other := f.consumer()
	defer other.Close()
	if store, ok := other.(driver.DeadLetterStore); ok {
		n, err = store.Redrive(f.ctx, []string{unknown, dead})
		check("driver Redrive(unknown, redriven)", n, 0, err, unknown, dead)
	}
	// Only IDs that are dead letters: no error.
	if n, err := r.sub.Redrive(f.ctx, nil); n != 0 || err != nil {
		f.t.Fatalf("Redrive(no IDs) = %d, %v; want 0, nil", n, err)
	}
}
