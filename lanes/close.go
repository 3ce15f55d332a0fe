package lanes

// This file: Close and Stats.

import (
	"context"
	"time"

	"github.com/keyorder/keyorder"
)

// Close stops the pool. It stops admitting items (Submit returns
// keyorder.ErrClosed, including Submits blocked on a full lane), workers stop
// taking new items, and Close waits for running handlers to return. If ctx
// ends first, Close cancels the handlers' context, still waits for them to
// return, and reports ctx.Err().
//
// It then returns every item still waiting — never started, parked behind
// its key, delayed, or handed back by RetryAt — oldest first within each
// lane, lane after lane. A second Close returns nil, keyorder.ErrClosed.
func (p *Pool[T]) Close(ctx context.Context) (leftover []T, err error) {
	p.closeMu.Lock()
	if p.closed {
		p.closeMu.Unlock()
		return nil, keyorder.ErrClosed
	}
	p.closed = true
	p.closeMu.Unlock()
	p.stopping.Store(true)

	for _, l := range p.lanes {
		l.mu.Lock()
		l.closed = true
		if l.timer != nil {
			l.timer.Stop()
			l.timerAt = time.Time{}
		}
		l.ready.Broadcast()
		l.mu.Unlock()
	}
	close(p.closing)

	stopped := make(chan struct{})
	go func() {
		<-p.stopped
		p.inline.Wait()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-ctx.Done():
		p.cancel()
		<-stopped
		err = ctx.Err()
	}
	p.cancel()

	for _, l := range p.lanes {
		l.mu.Lock()
		for _, it := range l.q.Drain() {
			leftover = append(leftover, it.Value)
		}
		for l.staged.len() > 0 {
			leftover = append(leftover, l.staged.pop().Value)
		}
		l.mu.Unlock()
	}
	return leftover, err
}

// Stats returns a snapshot of the pool's load. It takes each lane's lock
// briefly and allocates nothing.
func (p *Pool[T]) Stats() Stats {
	var s Stats
	for _, l := range p.lanes {
		l.mu.Lock()
		s.Queued += l.waiting()
		s.InFlight += l.q.InFlight() + l.direct
		l.mu.Unlock()
	}
	return s
}
