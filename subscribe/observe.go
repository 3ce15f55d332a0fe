package subscribe

import (
	"context"

	"github.com/keyorder/keyorder"
)

// Outcome is what became of one handler attempt.
type Outcome int

// Outcomes of an attempt.
const (
	// OutcomeAck: the handler succeeded and the message is acknowledged.
	OutcomeAck Outcome = iota + 1
	// OutcomeRetry: the handler failed and the message will be retried
	// (by the broker after Nack, or in process).
	OutcomeRetry
	// OutcomeDeadLetter: the message is dead-lettered (a permanent error
	// or attempts exhausted).
	OutcomeDeadLetter
	// OutcomeReleased: the attempt was cancelled by shutdown and the
	// message returned to the broker without counting it; or, in a batch
	// (RunBatch), the message came after the one that failed and returns
	// to pending, its attempt not counted.
	OutcomeReleased
	// OutcomeLeaseLost: the message's lease was lost while the handler
	// ran; the broker redelivers it.
	OutcomeLeaseLost
)

// String returns the outcome's name as used in telemetry: "ack", "retry",
// "dead_letter", "released", "lease_lost".
func (o Outcome) String() string {
	switch o {
	case OutcomeAck:
		return "ack"
	case OutcomeRetry:
		return "retry"
	case OutcomeDeadLetter:
		return "dead_letter"
	case OutcomeReleased:
		return "released"
	case OutcomeLeaseLost:
		return "lease_lost"
	}
	return "unknown"
}

// Observer sees a Subscriber's work, for tracing and metrics. Module
// github.com/keyorder/keyorder/otelkeyorder implements it with
// OpenTelemetry; the subscribe package itself imports no telemetry API.
// Config.Observer nil means no observation, and costs one nil check per
// attempt.
type Observer interface {
	// Attach is called once by New. The observer may read s's state (for
	// gauges such as Outstanding) until detach is called, by Close. detach
	// may be nil.
	Attach(s *Subscriber) (detach func())
	// StartProcess is called before each handler attempt with the
	// delivery (its Headers carry what the publisher's observer added) and
	// returns the context the handler runs with. end is called once, when
	// the attempt's outcome is decided and before the settlement is sent
	// to the broker, with the handler's error (nil for OutcomeAck).
	StartProcess(ctx context.Context, d *keyorder.Delivery) (hctx context.Context, end func(o Outcome, err error))
}

// Outstanding returns how many received messages are not yet finished
// (being handled, waiting in a lane or on a retry, or being settled).
func (s *Subscriber) Outstanding() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.outstanding.n
}

// observed ends an attempt's observation, if any, with its outcome.
func observed(end func(Outcome, error), o Outcome, err error) {
	if end != nil {
		end(o, err)
	}
}

// observeAttach attaches Config.Observer, if any, to s (from New).
func (s *Subscriber) observeAttach() {
	if s.cfg.Observer != nil {
		s.unobserve = s.cfg.Observer.Attach(s)
	}
}

// observeDetach detaches Config.Observer, if attached (from Close).
func (s *Subscriber) observeDetach() {
	if s.unobserve != nil {
		s.unobserve()
		s.unobserve = nil
	}
}
