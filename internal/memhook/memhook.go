// Package memhook is the test surface of the in-memory broker
// (adapters/memory): its drivers, reached below the portable layer, and its
// fault hooks (failing sends and settlements, crashing a consumer).
//
// Package memory exports only what an application needs (Broker and its
// Open and Create methods); the tests of the portable layer, the
// conformance suite and keyordertest need more: they wrap the broker's
// drivers and make them fail on demand. This package is that surface,
// internal so that it is not part of the module's API. Package memory
// registers its implementation here when it is imported; Of is meant to be
// called with a *memory.Broker. Applications reach the fault hooks through
// package keyordertest.
package memhook

import (
	"errors"
	"fmt"

	"github.com/keyorder/keyorder/driver"
)

// ErrTransient can be wrapped by an injected failure to make it retryable:
// the memory drivers' IsRetryable reports true for it.
var ErrTransient = errors.New("memory: transient failure")

// ErrCrashed is returned by every call of a consumer after Crash. It is
// permanent (IsRetryable reports false).
var ErrCrashed = errors.New("memory: consumer crashed (fault injection)")

// Op names a settlement call of a subscription driver, for
// Broker.FailSettlements.
type Op string

// The settlement calls FailSettlements can fail.
const (
	OpAck          Op = "ack"
	OpNack         Op = "nack"
	OpRelease      Op = "release"
	OpDeadLetter   Op = "deadletter"
	OpExtendLeases Op = "extendleases"
	OpReturn       Op = "return" // driver.Returner
)

// Fault is what an injected settlement failure does. The zero Fault lets
// the call through.
type Fault struct {
	// Err is returned by the call. Wrap ErrTransient to make it retryable;
	// any other error is permanent.
	Err error
	// Applied makes the call take effect before Err is returned, as when
	// the broker acted but its answer was lost on the way back.
	Applied bool
}

// Broker is the test surface of a memory broker.
type Broker interface {
	// TopicDriver returns a publishing driver for topic, creating it if
	// needed.
	TopicDriver(topic string) driver.Topic
	// SubscriptionDriver returns a consuming driver for an existing
	// subscription. Each call returns a separate consumer, as separate
	// processes would have.
	SubscriptionDriver(subscription string) (Subscription, error)
	// FailSends makes every SendBatch on topic call fn first; a non-nil
	// result fails the batch without delivering anything. nil stops.
	FailSends(topic string, fn func(ms []*driver.Message) error)
	// FailSettlements makes every settlement call (Ack, Nack, Release,
	// DeadLetter, ExtendLeases, Return) of every consumer of the subscription call
	// fn first, with the messages of the call; the Fault it returns decides
	// the call's outcome. nil stops. fn may be called concurrently.
	FailSettlements(subscription string, fn func(op Op, ms []*driver.Message) Fault) error
}

// Subscription is a consuming driver of a memory subscription.
type Subscription interface {
	driver.Subscription
	driver.DeadLetterStore
	driver.Namer
	driver.Returner
	// Crash makes this consumer behave as a process that died: from now on
	// every call fails with ErrCrashed without reaching the broker (a
	// Receive under way returns it at once), so nothing it holds is
	// settled or extended, and its leases expire after the subscription's
	// lease duration, counting an attempt for the messages that may have
	// been running. A consumer opened afterwards plays the restarted
	// process.
	Crash()
}

var of func(b any) (Broker, bool)

// Register installs the implementation of Of. Package memory calls it from
// its init.
func Register(f func(b any) (Broker, bool)) { of = f }

// Of returns the test surface of b, a *memory.Broker. It panics for
// anything else, or when package memory is not linked in.
func Of(b any) Broker {
	if of == nil {
		panic("memhook: package adapters/memory is not imported")
	}
	h, ok := of(b)
	if !ok {
		panic(fmt.Sprintf("memhook: Of(%T): want a *memory.Broker", b))
	}
	return h
}
