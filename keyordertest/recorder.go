package keyordertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/policy"
	"github.com/keyorder/keyorder/subscribe"
)

// Outcome is what became of one handling, as the subscriber will act on it.
type Outcome int

// Outcomes of a handling.
const (
	// Running: the handler has not returned yet.
	Running Outcome = iota
	// Ack: the handler returned nil; the message is acknowledged.
	Ack
	// Retry: the handler returned an error within the attempt budget; the
	// message will be handled again.
	Retry
	// Panic: the handler panicked within the attempt budget; the message
	// will be handled again.
	Panic
	// DeadPermanent: the handler returned keyorder.Permanent; the message is
	// dead-lettered.
	DeadPermanent
	// DeadBudget: the handler failed (an error or a panic) on its last
	// allowed attempt; the message is dead-lettered.
	DeadBudget
	// Abandoned: the handler failed after its context was cancelled (the
	// message's lease was lost, or the subscriber shut down); the broker
	// redelivers the message and nothing was decided.
	Abandoned
)

var outcomeNames = [...]string{"running", "ack", "retry", "panic", "dead letter (permanent)", "dead letter (attempts exhausted)", "abandoned (context cancelled)"}

// String names the outcome in words.
func (o Outcome) String() string {
	if o < 0 || int(o) >= len(outcomeNames) {
		return fmt.Sprintf("Outcome(%d)", int(o))
	}
	return outcomeNames[o]
}

// Resolves reports whether the outcome settles the message for good
// (acknowledged or dead-lettered).
func (o Outcome) Resolves() bool { return o == Ack || o == DeadPermanent || o == DeadBudget }

// Handling is one call of the handler, as the Recorder saw it.
type Handling struct {
	// Key and ID are the delivered message's ordering key and ID.
	Key, ID string
	// Label names the message in explanations (RecorderConfig.Label).
	Label string
	// Attempt is the delivery's attempt number.
	Attempt int
	// Start and End are the wall-clock (or synctest) times the handler was
	// entered and returned; End is zero while it runs.
	Start, End time.Time
	// StartSeq and EndSeq order every start and end the Recorder saw: one
	// counter for all of them, so two handlings overlap exactly when each
	// started before the other ended, even when their times are equal (as
	// under a fake clock). EndSeq is zero while the handler runs.
	StartSeq, EndSeq uint64
	// Outcome is what became of the handling.
	Outcome Outcome
	// Err is the handler's error (nil for Ack and Running); a panic is
	// recorded as a *keyorder.PanicError.
	Err error
	// Panicked is set when the handler panicked (Outcome Panic, DeadBudget
	// or Abandoned).
	Panicked bool

	permanent bool
	canceled  bool
}

// Published is one published message, in the order the application
// published its key.
type Published struct {
	Key, ID, Label string
}

// History is what a Recorder saw: the published messages in publish order
// and every handling in start order.
type History struct {
	Published []Published
	Handlings []Handling
}

// RecorderConfig configures a Recorder. A nil *RecorderConfig means all
// defaults.
type RecorderConfig struct {
	// MaxAttempts is the subscription's attempt budget, used to tell a
	// failure that will be retried from one that dead-letters the message.
	// Defaults to policy.MaxAttemptsDefault; set it to the subscriber's
	// Retry().MaxAttempts when the subscription stores its own retry policy
	// (PostgreSQL), or call SetMaxAttempts once the subscriber exists.
	MaxAttempts int
	// Label names a message in explanations. Defaults to its payload when
	// that is short printable text, else its ID.
	Label func(m *keyorder.Message) string
}

// Recorder stamps every handling of the handler it wraps (Middleware) and
// the publishes it is told about (Published), for Verify. It is safe for
// concurrent use; one Recorder may wrap the handlers of several
// subscribers (consumers) of one subscription.
type Recorder struct {
	label func(m *keyorder.Message) string

	mu          sync.Mutex
	maxAttempts int
	seq         uint64
	published   []Published
	handlings   []*Handling
	changed     chan struct{} // closed and replaced on every record
}

// NewRecorder returns an empty Recorder.
func NewRecorder(cfg *RecorderConfig) *Recorder {
	r := &Recorder{label: DefaultLabel, maxAttempts: policy.MaxAttemptsDefault, changed: make(chan struct{})}
	if cfg != nil {
		if cfg.MaxAttempts > 0 {
			r.maxAttempts = cfg.MaxAttempts
		}
		if cfg.Label != nil {
			r.label = cfg.Label
		}
	}
	return r
}

// SetMaxAttempts sets the attempt budget used to classify failures (see
// RecorderConfig.MaxAttempts). Outcomes are classified when History is
// taken, so it may be called after handlings were recorded.
func (r *Recorder) SetMaxAttempts(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n > 0 {
		r.maxAttempts = n
	}
}

// DefaultLabel labels a message by its payload when that is up to 32
// printable ASCII bytes, else by its ID.
func DefaultLabel(m *keyorder.Message) string {
	p := m.Payload
	if len(p) == 0 || len(p) > 32 {
		return m.ID
	}
	for _, c := range p {
		if c < 0x20 || c > 0x7e {
			return m.ID
		}
	}
	return string(p)
}

// Published records messages as published, in the order given. A message
// is known by its ID, which a publisher never writes into the caller's
// Message: give each message its ID before publishing (keyorder.NewID), or
// record a copy carrying the ID Publish returned. Record each key's messages
// in the order the application published them; the order between keys does
// not matter.
func (r *Recorder) Published(ms ...*keyorder.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range ms {
		r.published = append(r.published, Published{Key: m.Key, ID: m.ID, Label: r.label(m)})
	}
	r.signal()
}

// signal wakes WaitResolved; r.mu is held.
func (r *Recorder) signal() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// WaitResolved blocks until every message recorded as published has a
// handling that resolves it (acknowledged or dead-lettered, as far as the
// handler's result tells) and no handling runs, or ctx ends (then it
// returns ctx.Err()). A message the subscriber dead-letters without calling
// the handler (its attempts used up by lost leases) never counts as
// resolved here: bound the wait with ctx.
func (r *Recorder) WaitResolved(ctx context.Context) error {
	for {
		r.mu.Lock()
		done, ch := r.resolvedLocked(), r.changed
		r.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

func (r *Recorder) resolvedLocked() bool {
	resolved := map[string]bool{}
	for _, h := range r.handlings {
		if h.EndSeq == 0 {
			return false
		}
		r.classify(h)
		if h.Outcome.Resolves() {
			resolved[h.ID] = true
		}
	}
	for _, p := range r.published {
		if !resolved[p.ID] {
			return false
		}
	}
	return true
}

// Middleware returns a subscribe.Middleware that records every handling.
// Put it first in subscribe.Config.Middleware (outermost) so it sees what
// the subscriber sees, including failures injected by inner middleware. A
// panic is recorded and re-raised, so the subscriber still recovers it.
func (r *Recorder) Middleware() subscribe.Middleware {
	return func(next subscribe.HandlerFunc) subscribe.HandlerFunc {
		return func(ctx context.Context, d *keyorder.Delivery) (err error) {
			h := r.begin(d)
			defer func() {
				if p := recover(); p != nil {
					r.end(ctx, h, &keyorder.PanicError{Value: p}, true)
					panic(p)
				}
			}()
			err = next(ctx, d)
			r.end(ctx, h, err, false)
			return err
		}
	}
}

func (r *Recorder) begin(d *keyorder.Delivery) *Handling {
	label := r.label(&d.Message)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	h := &Handling{Key: d.Key, ID: d.ID, Label: label, Attempt: d.Attempt, Start: time.Now(), StartSeq: r.seq}
	r.handlings = append(r.handlings, h)
	return h
}

func (r *Recorder) end(ctx context.Context, h *Handling, err error, panicked bool) {
	var perm *keyorder.PermanentError
	permanent := err != nil && errors.As(err, &perm)
	canceled := err != nil && ctx.Err() != nil
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	h.End, h.EndSeq = time.Now(), r.seq
	h.Err, h.Panicked, h.permanent, h.canceled = err, panicked, permanent, canceled
	r.signal()
}

// classify sets h.Outcome; r.mu is held.
func (r *Recorder) classify(h *Handling) {
	switch {
	case h.EndSeq == 0:
		h.Outcome = Running
	case h.Err == nil:
		h.Outcome = Ack
	case h.canceled:
		h.Outcome = Abandoned
	case h.permanent && !h.Panicked:
		h.Outcome = DeadPermanent
	case h.Attempt >= r.maxAttempts:
		h.Outcome = DeadBudget
	case h.Panicked:
		h.Outcome = Panic
	default:
		h.Outcome = Retry
	}
}

// History returns a copy of what was recorded so far, handlings in start
// order, each with its Outcome classified.
func (r *Recorder) History() History {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := History{Published: slices.Clone(r.published), Handlings: make([]Handling, len(r.handlings))}
	for i, h := range r.handlings {
		r.classify(h)
		out.Handlings[i] = *h
	}
	return out
}

// Reset forgets everything recorded.
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.published, r.handlings = nil, nil
	r.signal()
}
