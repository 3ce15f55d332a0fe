package subscribe

// This file: the queue that carries acknowledgements from the lanes to the
// acker.

import "sync"

// ackQueue carries the items to acknowledge from the lanes to the acker.
// The acker takes everything queued at once: one lock and, when it had
// gone idle, one wake-up per batch, where a channel costs an operation per
// item on both sides. It is not bounded: what it holds is outstanding, and
// flow control (Config.MaxOutstanding) bounds that.
type ackQueue struct {
	mu     sync.Mutex
	q      []*item
	idle   bool // the acker waits on wake
	closed bool
	wake   chan struct{}
}

func newAckQueue() *ackQueue {
	return &ackQueue{wake: make(chan struct{}, 1)}
}

// push queues it for the acker. After close it does nothing: only a
// handler Run returned without (Close's deadline) can push then, and its
// message is left to the broker.
func (a *ackQueue) push(it *item) {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	a.q = append(a.q, it)
	wake := a.idle
	a.idle = false
	a.mu.Unlock()
	if wake {
		a.signal()
	}
}

// take waits until items are queued and returns them all, handing the
// queue spare (emptied) for what comes next; ok is false once the queue
// is closed and empty.
func (a *ackQueue) take(spare []*item) (its []*item, ok bool) {
	for {
		a.mu.Lock()
		if len(a.q) > 0 {
			its, a.q = a.q, spare[:0]
			a.mu.Unlock()
			return its, true
		}
		if a.closed {
			a.mu.Unlock()
			return nil, false
		}
		a.idle = true
		a.mu.Unlock()
		<-a.wake
	}
}

// close ends the queue: take returns what is queued, then false.
func (a *ackQueue) close() {
	a.mu.Lock()
	a.closed = true
	wake := a.idle
	a.idle = false
	a.mu.Unlock()
	if wake {
		a.signal()
	}
}

func (a *ackQueue) signal() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}
