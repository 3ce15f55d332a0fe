package subscribe

// This file: the context one handler attempt runs with, built only when
// used.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
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
}

// handlerKey is the context key under which an attempt's context answers
// with itself, so that Close can tell a call from inside a handler (its
// ctx derived from the handler's) from any other.
type handlerKey struct{}

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

// Value answers handlerKey with c itself, without building the real
// context, and every other key from the real context.
func (c *attemptCtx) Value(key any) any {
	if _, ok := key.(handlerKey); ok {
		return c
	}
	return c.ctx().Value(key)
}
func (c *attemptCtx) String() string { return fmt.Sprint(c.ctx()) }
