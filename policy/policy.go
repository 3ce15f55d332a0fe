// Package policy holds the rules a subscription or publisher is configured
// with: how an ordering group is delivered (Ordering), what happens to a
// message without a key (MissingKey), and how failed messages are retried
// (Retry).
//
// Ordering is a property of a subscription, fixed when it is created, because
// every consumer of the subscription must agree on it: if one process ran a
// key's messages concurrently while another held them, no one would hold the
// guarantee.
package policy

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"
)

// Ordering is how messages that share a key are delivered.
type Ordering int

const (
	// Ordered allows at most one message per key in flight, and the next is
	// delivered only after the current one is acknowledged or dead-lettered:
	// a failed message holds everything behind it. It is the zero value, so
	// an options struct that does not say gets the strictest policy.
	Ordered Ordering = iota
	// Exclusive allows at most one message per key in flight; a failed
	// message waiting for its retry lets later messages of its key run first.
	Exclusive
	// Parallel puts no constraint on a key: any number of its messages may be
	// in flight, and a failed message does not hold the rest.
	Parallel
)

// String returns "parallel", "exclusive" or "ordered".
func (o Ordering) String() string {
	switch o {
	case Parallel:
		return "parallel"
	case Exclusive:
		return "exclusive"
	case Ordered:
		return "ordered"
	}
	return fmt.Sprintf("Ordering(%d)", int(o))
}

// Valid reports whether o is one of Parallel, Exclusive and Ordered.
// Configurations reject any other value.
func (o Ordering) Valid() bool { return o >= Ordered && o <= Parallel }

// Keyed reports whether the ordering constrains messages of one key.
func (o Ordering) Keyed() bool { return o == Exclusive || o == Ordered }

// ParseOrdering parses "parallel", "exclusive" or "ordered" (any case).
func ParseOrdering(s string) (Ordering, error) {
	switch strings.ToLower(s) {
	case "parallel":
		return Parallel, nil
	case "exclusive":
		return Exclusive, nil
	case "ordered":
		return Ordered, nil
	}
	return 0, fmt.Errorf("policy: unknown ordering %q (want parallel, exclusive or ordered)", s)
}

// MissingKey is what happens to a message that has no ordering key.
type MissingKey int

const (
	// MissingKeyDefault resolves to Reject under Exclusive and Ordered and to
	// Unordered under Parallel.
	MissingKeyDefault MissingKey = iota
	// Reject fails the publish with keyorder.ErrMissingKey; nothing is sent.
	Reject
	// Unordered lets the message through with no group: it runs whenever a
	// worker is free. There is no shared "empty key" group.
	Unordered
)

// String returns "default", "reject" or "unordered".
func (m MissingKey) String() string {
	switch m {
	case MissingKeyDefault:
		return "default"
	case Reject:
		return "reject"
	case Unordered:
		return "unordered"
	}
	return fmt.Sprintf("MissingKey(%d)", int(m))
}

// Valid reports whether m is one of MissingKeyDefault, Reject and
// Unordered. Configurations reject any other value.
func (m MissingKey) Valid() bool { return m >= MissingKeyDefault && m <= Unordered }

// Resolve returns the effective policy for ordering o.
func (m MissingKey) Resolve(o Ordering) MissingKey {
	if m != MissingKeyDefault {
		return m
	}
	if o.Keyed() {
		return Reject
	}
	return Unordered
}

// ParseMissingKey parses "reject" or "unordered" (any case); "" is the default.
func ParseMissingKey(s string) (MissingKey, error) {
	switch strings.ToLower(s) {
	case "", "default":
		return MissingKeyDefault, nil
	case "reject":
		return Reject, nil
	case "unordered":
		return Unordered, nil
	}
	return 0, fmt.Errorf("policy: unknown missing-key policy %q (want reject or unordered)", s)
}

// Defaults for Retry.
const (
	MaxAttemptsDefault = 10
	MinBackoffDefault  = 100 * time.Millisecond
	MaxBackoffDefault  = 1 * time.Minute
)

// Retry is how failed messages are retried.
type Retry struct {
	// MaxAttempts is how many times a message is tried before it is
	// dead-lettered. Defaults to MaxAttemptsDefault; must not be negative.
	MaxAttempts int
	// MinBackoff is the delay before the first retry. Defaults to
	// MinBackoffDefault.
	MinBackoff time.Duration
	// MaxBackoff caps the delay. Defaults to MaxBackoffDefault.
	MaxBackoff time.Duration
	// NoJitter disables the ±20% jitter (deterministic tests).
	NoJitter bool
}

// WithDefaults returns a copy of r with zero fields set to their defaults.
func (r Retry) WithDefaults() Retry {
	if r.MaxAttempts == 0 {
		r.MaxAttempts = MaxAttemptsDefault
	}
	if r.MinBackoff == 0 {
		r.MinBackoff = MinBackoffDefault
	}
	if r.MaxBackoff == 0 {
		r.MaxBackoff = MaxBackoffDefault
	}
	return r
}

// Validate reports a field out of range.
func (r Retry) Validate() error {
	switch {
	case r.MaxAttempts < 0:
		return fmt.Errorf("policy: Retry.MaxAttempts must be positive, got %d", r.MaxAttempts)
	case r.MinBackoff < 0 || r.MaxBackoff < 0:
		return fmt.Errorf("policy: Retry backoff must not be negative")
	case r.MaxBackoff != 0 && r.MinBackoff > r.MaxBackoff:
		return fmt.Errorf("policy: Retry.MinBackoff %v exceeds MaxBackoff %v", r.MinBackoff, r.MaxBackoff)
	}
	return nil
}

// Backoff returns the delay before retrying after the given failed attempt
// (1-based): MinBackoff doubled per attempt, capped at MaxBackoff, with ±20%
// jitter unless NoJitter. It is a pure function of the attempt, so a delay
// can be recomputed by any process from the attempt count a broker stored.
func (r Retry) Backoff(attempt int) time.Duration {
	r = r.WithDefaults()
	if attempt < 1 {
		attempt = 1
	}
	d := float64(r.MinBackoff) * math.Pow(2, float64(attempt-1))
	if d > float64(r.MaxBackoff) {
		d = float64(r.MaxBackoff)
	}
	if !r.NoJitter {
		d *= 0.8 + 0.4*rand.Float64()
	}
	return time.Duration(d)
}
