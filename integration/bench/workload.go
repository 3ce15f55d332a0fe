package main

import (
	"encoding/binary"
	"strconv"
	"sync"
	"sync/atomic"
)

// workload is one run's messages in publish order: message i has key
// i%keys and is the (i/keys)-th message of its key. Every payload starts
// with its key's index (4 bytes) and its per-key sequence number (8 bytes),
// so a consumer checks order from the payload alone.
type workload struct {
	keys     []string // key index → key
	msgKey   []int    // message → key index
	payloads [][]byte
	perKey   int // messages of the busiest key
}

const headerBytes = 12

func newWorkload(n, keys, size int) *workload {
	w := &workload{perKey: (n + keys - 1) / keys}
	for k := range keys {
		w.keys = append(w.keys, "key-"+strconv.Itoa(k))
	}
	for i := range n {
		p := make([]byte, max(size, headerBytes))
		binary.BigEndian.PutUint32(p, uint32(i%keys))
		binary.BigEndian.PutUint64(p[4:], uint64(i/keys))
		w.msgKey = append(w.msgKey, i%keys)
		w.payloads = append(w.payloads, p)
	}
	return w
}

func (w *workload) n() int { return len(w.payloads) }

// key returns message i's key.
func (w *workload) key(i int) string { return w.keys[w.msgKey[i]] }

// byKey returns the message indexes of each key, in publish order.
func (w *workload) byKey() [][]int {
	out := make([][]int, len(w.keys))
	for i, k := range w.msgKey {
		out[k] = append(out[k], i)
	}
	return out
}

// orderCheck counts what a consumer saw: unique messages, duplicates
// (a message seen before) and per-key order violations (a message handled
// after a later message of its key).
type orderCheck struct {
	keys    []keyState
	n       int64
	handled atomic.Int64
	viol    atomic.Int64
	dups    atomic.Int64
	done    chan struct{}
	once    sync.Once
}

type keyState struct {
	mu      sync.Mutex
	seen    []bool
	maxSeen int64
}

func newOrderCheck(w *workload) *orderCheck {
	c := &orderCheck{keys: make([]keyState, len(w.keys)), n: int64(w.n()), done: make(chan struct{})}
	for i := range c.keys {
		c.keys[i].seen = make([]bool, w.perKey)
		c.keys[i].maxSeen = -1
	}
	return c
}

// see records one delivered payload. It reports false for a payload that
// is not the workload's (too short or out of range), which counts as
// neither.
func (c *orderCheck) see(payload []byte) bool {
	if len(payload) < headerBytes {
		return false
	}
	k := int(binary.BigEndian.Uint32(payload))
	seq := int64(binary.BigEndian.Uint64(payload[4:]))
	if k >= len(c.keys) || seq >= int64(len(c.keys[k].seen)) {
		return false
	}
	ks := &c.keys[k]
	ks.mu.Lock()
	if ks.seen[seq] {
		ks.mu.Unlock()
		c.dups.Add(1)
		return true
	}
	ks.seen[seq] = true
	if seq < ks.maxSeen {
		c.viol.Add(1)
	} else {
		ks.maxSeen = seq
	}
	ks.mu.Unlock()
	if c.handled.Add(1) == c.n {
		c.once.Do(func() { close(c.done) })
	}
	return true
}
