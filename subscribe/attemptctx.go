package subscribe

// This file: the context one handler attempt runs with, built only when
// used.

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
)

// attemptCtx is the context a handler attempt is given (a message's under
// Run, a batch's under RunBatch): what context.WithCancel(parent) would
// return, cancelled when the attempt ends or a lease of its messages is
// lost, except that the real WithCancel context is only
// created the first time something looks at it (Done, Err, Value, String).
// A handler that never touches its ctx, the common fast handler, then costs
// no context allocation at all; the first attempt's attemptCtx is part of
// its (first) item.
//
// Every method but Deadline answers from the real context, so Done, Err,
// context.Cause, derived contexts and AfterFunc behave exactly as with
// WithCancel. Built after the attempt was cancelled (say a handler that
// kept ctx reads it later), the real context is cancelled at once, so the
// caller sees it cancelled, as it would have been. Deadline is the
// parent's either way, as a WithCancel context's is.
//
// An attemptCtx serves one attempt only: a handler may keep its ctx, which
// must stay cancelled, so a later attempt gets a new one.
type attemptCtx struct {
	parent context.Context
	// begun is when the attempt started, as time since Subscriber.born
	// (set before the handler runs; read by Close's report of handlers
	// still running).
	begun time.Duration

	ready atomic.Bool     // real is set; read it without mu
	ended bool            // cancel was called; guarded by mu
	mu    sync.Mutex      // guards the fields below (and ended) while !ready
	real  context.Context // the WithCancel context, once built
	stop  context.CancelFunc

	// The attempt as drivers see it (driver.Attempt, through
	// Value(driver.AttemptKey)): its member (one) or members (run, for a
	// batch of several) while it runs, none once it has ended, and their
	// subscriber. Guarded by mu. A single member is kept apart so that
	// Run's one-item slice, on the stack, is not retained.
	one *item
	run []*item
	sub *Subscriber
}

func (c *attemptCtx) ctx() context.Context {
	if c.ready.Load() {
		return c.real
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.real == nil {
		c.real, c.stop = context.WithCancel(c.parent)
		if c.ended {
			c.stop()
		}
		c.ready.Store(true)
	}
	return c.real
}

// cancel ends the attempt's context (as its CancelFunc would); it may be
// called more than once and from any goroutine.
func (c *attemptCtx) cancel() {
	c.mu.Lock()
	c.ended = true
	stop := c.stop
	c.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// end cancels the context, as cancel does, and reports whether cancel had
// been called before: one lock where asking and then cancelling take two.
func (c *attemptCtx) end() (cancelled bool) {
	c.mu.Lock()
	cancelled = c.ended
	c.ended = true
	c.one, c.run = nil, nil
	stop := c.stop
	c.mu.Unlock()
	if stop != nil {
		stop()
	}
	return cancelled
}

func (c *attemptCtx) Deadline() (time.Time, bool) { return c.parent.Deadline() }
func (c *attemptCtx) Done() <-chan struct{}       { return c.ctx().Done() }
func (c *attemptCtx) Err() error                  { return c.ctx().Err() }

// Value answers driver.AttemptKey itself, without building the real
// context; every other key from the real context.
func (c *attemptCtx) Value(key any) any {
	if key == driver.AttemptKey {
		return (*attempt)(c)
	}
	return c.ctx().Value(key)
}

// begin records the members of the attempt and their subscriber.
func (c *attemptCtx) begin(s *Subscriber, run []*item) {
	c.mu.Lock()
	if len(run) == 1 {
		c.one = run[0]
	} else {
		c.run = slices.Clone(run) // not retained: prepare filters its argument in place
	}
	c.sub = s
	c.mu.Unlock()
}

// members returns the members of the attempt (c.mu held).
func (c *attemptCtx) members() []*item {
	if c.one != nil {
		return []*item{c.one}
	}
	return c.run
}

// attempt is an attemptCtx as a driver.Attempt.
type attempt attemptCtx

var _ driver.Attempt = (*attempt)(nil)

// Message returns the driver message of d: the member d was handed for (by
// pointer, else by ID when one member alone has it), nil once the attempt
// has ended.
func (a *attempt) Message(d *keyorder.Delivery) *driver.Message {
	if d == nil {
		return nil
	}
	c := (*attemptCtx)(a)
	c.mu.Lock()
	defer c.mu.Unlock()
	var byID *driver.Message
	n := 0
	for _, it := range c.members() {
		if it.dp == d {
			return it.m
		}
		if it.m.ID == d.ID {
			byID = it.m
			n++
		}
	}
	if n == 1 {
		return byID
	}
	return nil
}

// LeaseLost marks the members of ms lost, later ones first, as a lease
// renewal that returned them does (keepLeases): decide then drops them
// instead of settling them. The handler's context is left alone: the
// handler is finishing (rolling back) already.
func (a *attempt) LeaseLost(ms []*driver.Message) {
	c := (*attemptCtx)(a)
	c.mu.Lock()
	var gone []*item
	for _, it := range c.members() {
		if slices.Contains(ms, it.m) {
			gone = append(gone, it)
		}
	}
	s := c.sub
	c.mu.Unlock()
	slices.SortFunc(gone, func(a, b *item) int { return cmp.Compare(b.seq, a.seq) })
	s.mu.Lock()
	s.leaseLost(gone)
	s.mu.Unlock()
	for _, it := range gone {
		it.fenced.Store(true)
		if !it.lost.Swap(true) {
			s.stats.LeasesLost.Add(1)
		}
	}
}
func (c *attemptCtx) String() string { return fmt.Sprint(c.ctx()) }
