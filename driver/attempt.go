package driver

import (
	"context"

	"github.com/keyorder/keyorder"
)

// Attempt is the handler attempt a context belongs to, as the portable
// subscriber exposes it to drivers: the context a handler is given (and
// every context derived from it) answers Value(AttemptKey) with the
// attempt while it runs. It lets a driver settle a delivery from inside the
// handler, in the application's own transaction (PostgreSQL's CompleteTx),
// and tell the subscriber when that finds the lease lost.
type Attempt interface {
	// Message returns the driver message d is a delivery of, or nil when d
	// is not one of this attempt's deliveries or the attempt has ended (the
	// handler returned).
	Message(d *keyorder.Delivery) *Message
	// LeaseLost tells the subscriber that the leases of ms (messages of
	// this attempt) were found lost while the handler ran, as if
	// ExtendLeases had returned them: the subscriber then settles none of
	// them, whatever the handler returns, since the broker may have handed
	// them to another consumer already.
	LeaseLost(ms []*Message)
}

type attemptKey struct{}

// AttemptKey is the context key under which a handler's context holds its
// Attempt.
var AttemptKey any = attemptKey{}

// AttemptOf returns the Attempt ctx belongs to, or nil when ctx is not (and
// does not derive from) a handler's context.
func AttemptOf(ctx context.Context) Attempt {
	a, _ := ctx.Value(AttemptKey).(Attempt)
	return a
}
