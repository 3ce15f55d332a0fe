package nats

// This file: the driver's own asynchronous publishing. nats.go's
// PublishMsgAsync keeps a future per message (two channels when waited
// on, an entry in a map under the client's lock, a timer when an ack
// timeout is set) and decodes every acknowledgement with encoding/json;
// on a machine where the client shares the CPU with the server that was
// a third of the driver's publishing CPU. SendBatch needs less: every
// message of a batch acknowledged, or the first failure. So each message
// carries a reply subject <inbox>.<batch>.<index>, one subscription of
// the topic's collects the acknowledgements, and a batch completes when
// its count of unacknowledged messages reaches zero. A plain
// acknowledgement ({"stream":…,"seq":…}) is recognised without decoding;
// anything else is decoded in full.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// acker collects the acknowledgements of a topic's publishes.
type acker struct {
	sub    *nats.Subscription
	prefix string // the inbox and a dot

	mu      sync.Mutex
	next    uint64
	batches map[uint64]*pubBatch
	idle    chan struct{} // closed when batches empties, for Close; nil if none waits
}

// pubBatch is one SendBatch waiting for its acknowledgements.
type pubBatch struct {
	left  int
	acked []bool
	err   error // the first failure
	errAt int   // its message's index
	done  chan struct{}
}

// newAcker subscribes to a fresh inbox of nc for acknowledgements.
func newAcker(nc *nats.Conn) (*acker, error) {
	a := &acker{prefix: nc.NewInbox() + ".", batches: map[uint64]*pubBatch{}}
	sub, err := nc.Subscribe(a.prefix+"*.*", a.handle)
	if err != nil {
		return nil, fmt.Errorf("nats: subscribe to publish acknowledgements: %w", err)
	}
	// An acknowledgement dropped for a slow subscriber would leave its
	// batch waiting until the ack timeout: never drop one (what is pending
	// is bounded by the publisher's messages in flight).
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("nats: publish acknowledgements: %w", err)
	}
	a.sub = sub
	return a, nil
}

// start registers a batch of n messages and returns its ID and the prefix
// of its messages' reply subjects (the index follows).
func (a *acker) start(n int) (uint64, *pubBatch, string) {
	b := &pubBatch{left: n, acked: make([]bool, n), errAt: -1, done: make(chan struct{})}
	a.mu.Lock()
	a.next++
	id := a.next
	a.batches[id] = b
	a.mu.Unlock()
	return id, b, a.prefix + strconv.FormatUint(id, 10) + "."
}

// left is how many of b's messages are unacknowledged.
func (a *acker) left(b *pubBatch) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return b.left
}

// forget drops a batch that is given up (its acknowledgements arriving
// later are ignored).
func (a *acker) forget(id uint64) {
	a.mu.Lock()
	delete(a.batches, id)
	a.idleLocked()
	a.mu.Unlock()
}

func (a *acker) idleLocked() {
	if a.idle != nil && len(a.batches) == 0 {
		close(a.idle)
		a.idle = nil
	}
}

// drained returns a channel closed once no batch waits.
func (a *acker) drained() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	ch := make(chan struct{})
	if len(a.batches) == 0 {
		close(ch)
		return ch
	}
	if a.idle == nil {
		a.idle = make(chan struct{})
	}
	return a.idle
}

// handle takes one acknowledgement (on the subscription's goroutine).
func (a *acker) handle(m *nats.Msg) {
	id, i, ok := parseReply(m.Subject, len(a.prefix))
	if !ok {
		return
	}
	err := ackError(m)
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.batches[id]
	if b == nil || i >= len(b.acked) || b.acked[i] {
		return
	}
	b.acked[i] = true
	if err != nil && (b.err == nil || i < b.errAt) {
		b.err, b.errAt = err, i
	}
	if b.left--; b.left == 0 {
		delete(a.batches, id)
		close(b.done)
		a.idleLocked()
	}
}

// parseReply reads <batch>.<index> from subject after skip bytes.
func parseReply(subject string, skip int) (id uint64, i int, ok bool) {
	if len(subject) <= skip {
		return 0, 0, false
	}
	s := subject[skip:]
	dot := -1
	for j := 0; j < len(s); j++ {
		c := s[j]
		switch {
		case c == '.' && dot < 0:
			dot = j
		case c < '0' || c > '9':
			return 0, 0, false
		}
	}
	if dot <= 0 || dot == len(s)-1 || len(s)-dot > 10 || dot > 19 {
		return 0, 0, false
	}
	for j := 0; j < dot; j++ {
		id = id*10 + uint64(s[j]-'0')
	}
	for j := dot + 1; j < len(s); j++ {
		i = i*10 + int(s[j]-'0')
	}
	return id, i, true
}

var (
	ackStream = []byte(`{"stream":"`)
	ackSeq    = []byte(`,"seq":`)
	ackErrKey = []byte(`"error"`)
)

// ackError returns nil for a positive acknowledgement, else the failure it
// reports: jetstream.ErrNoStreamResponse when no stream took the message,
// the server's *jetstream.APIError, or jetstream.ErrInvalidJSAck.
func ackError(m *nats.Msg) error {
	d := m.Data
	if len(d) == 0 {
		if m.Header.Get("Status") == "503" {
			return jetstream.ErrNoStreamResponse
		}
		return jetstream.ErrInvalidJSAck
	}
	// The common case, {"stream":"S","seq":N…}, without decoding: a stream
	// name is letters, digits, '_' and '-', so "error" in the data is a
	// key.
	if bytes.HasPrefix(d, ackStream) && bytes.Contains(d, ackSeq) && !bytes.Contains(d, ackErrKey) {
		return nil
	}
	var r struct {
		Stream string              `json:"stream"`
		Seq    uint64              `json:"seq"`
		Error  *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(d, &r); err != nil {
		return jetstream.ErrInvalidJSAck
	}
	if r.Error != nil {
		return r.Error
	}
	if r.Stream == "" {
		return jetstream.ErrInvalidJSAck
	}
	return nil
}
