// Package driver is the contract between keyorder's portable packages
// (publish, subscribe) and a backend: the interfaces a backend implements,
// the message it moves, the rule every message obeys (Validate), and the URL
// registry that lets an application choose a backend by configuration. It is
// the lowest layer a backend needs and imports nothing of keyorder but the
// core types, as database/sql/driver and gocloud.dev/pubsub/driver do; the
// backends themselves live under adapters/, one package (and for heavy SDKs
// one module) each. Applications import it only to hand a driver to
// publish.New or subscribe.New.
//
// The split follows gocloud.dev/pubsub: the portable packages publish and
// subscribe own validation, batching per key, retries, keyed worker lanes,
// leases, dead-letter decisions and shutdown; a driver only moves messages to
// and from its broker and classifies the broker's errors. Drivers never retry
// on their own, never run handlers and never decide a message's fate.
//
// Backends differ in where an ordering group is held after a failure. Some
// brokers hold it themselves (a PostgreSQL claim query, SQS visibility): they
// declare Capabilities.NativeHold, and the portable layer returns a failed
// message with Nack. Others deliver a key's later messages regardless (Pub/Sub
// streams them, Pulsar replays a nack out of order): there the portable layer
// holds the group in process, keeps the failed message's lease alive and
// retries it locally, and never calls Nack. Both shapes go through the same
// interface; subscribe branches on the capability, not on the backend.
//
// # URLs
//
// Each adapter registers its scheme in init() on DefaultMux, so importing it
// for side effects is enough:
//
//	import _ "github.com/keyorder/keyorder/adapters/memory"
//	pub, err := publish.Open(ctx, "mem://ledger", nil)
package driver

import (
	"context"
	"time"

	"github.com/keyorder/keyorder"
)

// Message is a message as a driver sees it.
type Message struct {
	// ID is the application-level message ID (publishers fill it). Drivers
	// must carry it to the subscriber unchanged.
	ID string
	// Key is the ordering key as the application gave it; "" for a keyless
	// message. A driver that must map keys (SQS group ids) maps them itself
	// and still returns the original Key on receive.
	Key string
	// Payload is the body.
	Payload []byte
	// Headers are string attributes. The portable layer keeps
	// keyorder.HeaderPartitionKey out of them on publish; drivers add it
	// back on receive only through Key.
	Headers map[string]string
	// NotBefore is the requested delivery delay; zero for none.
	NotBefore time.Time

	// AckID identifies this delivery to the driver (set by Receive).
	AckID any
	// Attempt is the attempt this delivery is, 1 on the first (set by
	// Receive; 0 when the broker does not count). It counts the earlier
	// deliveries that were attempts: a failed one (Nack), or one whose
	// lease was lost while the message may have been running. Deliveries
	// that never ran are not attempts: messages given back with Release,
	// the rest of a chain whose head failed, a message held for its
	// not-before time, and, after a lost lease, every message claimed with
	// it except the one that may have been running (under Ordered, the
	// first unsettled message of its chain; a driver that implements
	// StartRecorder counts only those whose handler started). A driver whose broker counts
	// every delivery subtracts those it can recognise and documents what
	// it cannot. On a broker without Capabilities.NativeHold the retries
	// the portable layer runs in process are not deliveries, so after a
	// crash the redelivery's count restarts from the broker's (see the
	// pubsub package, "Attempts the service does not know").
	Attempt int
	// PublishTime is when the broker accepted the message (set by Receive
	// when known).
	PublishTime time.Time
	// Copy identifies the broker's copy of the message that this delivery
	// is of (set by Receive): every delivery of one copy carries an equal
	// value, and a copy the broker took in anew carries another: a
	// redriven dead letter (DeadLetterStore.Redrive), or the same ID
	// published again. It must be comparable with ==; nil when the broker
	// has no such identity. The portable layer tells by it a redelivery of
	// a message whose DeadLetter call failed (to be dead-lettered again,
	// unrun) from a redriven one (to be run).
	Copy any
}

// Limits are a backend's constraints on messages (see keyorder.Limits). The
// portable publisher (and every other publishing path, through Validate)
// checks them before anything is sent. Limits.Check sees the message as
// SendBatch will: a driver converts its *Message with CheckMessage to apply
// the same check on send.
type Limits = keyorder.Limits

// Topic is the publishing side of a driver.
type Topic interface {
	// SendBatch sends ms to the broker, in order. All messages of one call
	// share one Key, or all are keyless, unless the driver implements
	// MixedKeySender: then one call may carry the batches of several keys
	// (never keyless messages with them). SendBatch may be called
	// concurrently, but never concurrently for the same key: the portable
	// layer keeps one batch per key in flight, so a key's messages reach the
	// broker in publish order. It must not modify ms, nor retain ms, the
	// messages, their payloads or headers maps once it returns: it copies
	// what outlives the call, or serializes at send. (The Pub/Sub client
	// library may still read a payload it had not sent when ctx ended; the
	// portable publisher allows for that by sending its own copies.) It must
	// not retry: on error the portable layer decides (IsRetryable) and, for a
	// keyed batch, pauses the key. A batch is all-or-nothing as far as the
	// broker allows; when a broker can fail part of a batch the driver
	// returns an error for the whole batch (the messages may then be
	// delivered twice, never lost).
	SendBatch(ctx context.Context, ms []*Message) error
	// Limits returns the backend's message limits.
	Limits() Limits
	// IsRetryable reports whether a SendBatch error is transient.
	IsRetryable(err error) bool
	// ErrorCode classifies an error returned by this driver.
	ErrorCode(err error) keyorder.ErrorCode
	// Close releases the driver's resources.
	Close() error
}

// MixedKeySender is implemented by Topic drivers whose SendBatch accepts
// the messages of several keys in one call. The portable publisher then
// combines the batches of keys that are ready at the same time into one
// call instead of one call per key: a PublishBatch over 1,000 keys becomes
// a few round trips instead of 1,000. It still keeps at most one batch per
// key in flight, bounds each call by Limits (MaxBatchMessages,
// MaxBatchBytes), and treats a failed call as the failure of every key in
// it (each is retried or paused as a failed single-key batch is).
//
// A wrapper that embeds a Topic does not forward the method, so wrapping a
// driver turns the combining off unless the wrapper implements it too.
type MixedKeySender interface {
	// SendsMixedKeys reports whether SendBatch accepts a call whose
	// messages have several keys: each key's messages are sent in slice
	// order, and the call is all-or-nothing as far as the broker allows,
	// exactly as a call of one key. A driver whose answer depends on its
	// configuration reports false when it cannot.
	SendsMixedKeys() bool
}

// Capabilities describe how a subscription's broker delivers (see
// keyorder.Capabilities). For drivers: NativeHold promises that Nack(m, d)
// makes m deliverable again not before d, and that a second message of a
// group is never leased while one is, except the later members of a chain
// returned by the same Receive; LeaseDuration > 0 makes the portable layer
// call ExtendLeases.
type Capabilities = keyorder.Capabilities

// Subscription is the consuming side of a driver.
//
// Receive is called from one goroutine at a time; every other method may be
// called concurrently with Receive and with each other. Methods taking
// messages take messages returned by this Subscription's Receive, and must
// not retain the slice.
type Subscription interface {
	// Receive blocks until at least one message is available or ctx is done
	// (then it returns ctx.Err()), and returns at most maxMessages. Messages
	// of one group come in group order; consecutive messages of one group in
	// a result form a chain that the portable layer runs in order. Each
	// message's Payload belongs to this delivery: writing into it must change
	// neither a redelivery nor another subscription's delivery (a driver that
	// decodes fresh bytes per receive has nothing to do; the memory driver
	// copies). Payloads of one result may share a backing array, as a
	// client library's batch buffer does; the portable layer copies where a
	// handler could append across them.
	Receive(ctx context.Context, maxMessages int) ([]*Message, error)
	// Ack settles messages as done.
	Ack(ctx context.Context, ms []*Message) error
	// Nack returns a failed message to the broker, counting the attempt, to
	// be redelivered not before delay. Called only when
	// Capabilities.NativeHold is set.
	Nack(ctx context.Context, m *Message, delay time.Duration) error
	// Release returns messages that were received but not handled (the
	// rest of a chain whose head failed, or messages pending at shutdown) to
	// the broker without counting an attempt. On a broker without native
	// hold this may redeliver the group's later messages as well.
	Release(ctx context.Context, ms []*Message) error
	// ExtendLeases renews the leases of messages still being held or handled
	// and returns those whose lease was already lost (the broker may have
	// redelivered them). Called periodically when LeaseDuration > 0.
	ExtendLeases(ctx context.Context, ms []*Message) (lost []*Message, err error)
	// DeadLetter removes m from its group (the group continues without it)
	// and keeps it with reason and attempts where the backend keeps dead
	// letters.
	DeadLetter(ctx context.Context, m *Message, reason string, attempts int) error
	// Capabilities describes the subscription.
	Capabilities() Capabilities
	// IsRetryable reports whether an error from this driver is transient.
	IsRetryable(err error) bool
	// ErrorCode classifies an error returned by this driver.
	ErrorCode(err error) keyorder.ErrorCode
	// Close releases the driver's resources. Unsettled messages are left to
	// the broker (their leases expire).
	Close() error
}

// DeadLetter is a dead-lettered message as a driver returns it; subscribe
// hands it to applications as a keyorder.DeadLetter.
type DeadLetter struct {
	Message  Message
	Reason   string
	Attempts int
	DeadAt   time.Time
}

// DeadLetterStore is implemented by subscriptions whose backend keeps dead
// letters where they can be listed and redriven.
type DeadLetterStore interface {
	// DeadLetters lists up to limit dead letters, oldest first; limit <= 0
	// lists them all.
	DeadLetters(ctx context.Context, limit int) ([]DeadLetter, error)
	// Redrive puts the dead letters with these message IDs back on the
	// subscription, after everything that arrived meanwhile, with a fresh
	// attempt count. It returns how many were redriven. IDs that are not
	// dead letters of the subscription make it fail, after redriving the
	// others, with a *keyorder.NotDeadLetterError naming them
	// (NotDeadLetters builds it).
	Redrive(ctx context.Context, ids []string) (int, error)
}

// NotDeadLetters returns the error of a Redrive given ids that redrove the
// dead letters with the IDs in redriven: nil when every ID of ids is
// among them, else a *keyorder.NotDeadLetterError naming the others, each
// once, in the order of ids.
func NotDeadLetters(ids, redriven []string) error {
	seen := make(map[string]bool, len(redriven))
	for _, id := range redriven {
		seen[id] = true
	}
	var missing []string
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true // once
			missing = append(missing, id)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return &keyorder.NotDeadLetterError{IDs: missing}
}

// Portable returns m as an application sees it: a keyorder.Message whose
// headers carry the key in keyorder.HeaderPartitionKey (a copy; m is not
// changed).
func (m *Message) Portable() keyorder.Message {
	var headers map[string]string
	if len(m.Headers) > 0 || m.Key != "" {
		headers = make(map[string]string, len(m.Headers)+1)
		for k, v := range m.Headers {
			headers[k] = v
		}
		if m.Key != "" {
			headers[keyorder.HeaderPartitionKey] = m.Key
		}
	}
	return keyorder.Message{ID: m.ID, Key: m.Key, Payload: m.Payload, Headers: headers, NotBefore: m.NotBefore}
}

// StatsReporter is implemented by subscriptions whose backend can count
// what it keeps for the subscription. subscribe.Subscriber.Stats returns the
// counts as Stats.Backend.
type StatsReporter interface {
	// BackendStats returns the subscription's counts; a count the backend
	// cannot report is keyorder.Unknown.
	BackendStats(ctx context.Context) (keyorder.BackendStats, error)
}

// HeldKeyLister is implemented by subscriptions whose backend can list the
// ordering keys it holds (subscribe.Subscriber.HeldKeys).
type HeldKeyLister interface {
	// HeldKeys lists up to limit keys that are in flight or waiting,
	// soonest deliverable first; limit <= 0 lists them all.
	HeldKeys(ctx context.Context, limit int) ([]keyorder.HeldKey, error)
}

// StartRecorder is implemented by Subscription drivers that count a lost
// lease as an attempt only for messages whose handler started (PostgreSQL:
// a claimed message that sat in the process waiting for a worker when the
// process died is not counted). subscribe calls Started on the message's
// lane right before the handler runs (for a RunBatch batch, once with all
// the members that run); a message it never calls Started for is treated
// as never run when its lease is lost.
//
// Started is on the handlers' path: it should return at once and record
// asynchronously, batched. A driver that records asynchronously must bound
// what a late record costs: a handler that kills its process before its
// record lands is not counted, so a message that kills every consumer that
// way must still reach its attempt limit (the PostgreSQL driver records a
// message synchronously once one of its leases was lost unrecorded). An
// error means the record may not have landed; the handler runs anyway.
type StartRecorder interface {
	// Started records that the handlers of ms (messages of one key, in
	// order, or one keyless message) start now.
	Started(ctx context.Context, ms []*Message) error
}

// ReleaseRedeliverer is implemented by Subscription drivers without
// Capabilities.NativeHold whose broker hands a message given back with
// Release out again while this process runs, in key order: before the
// later messages of its key that are not leased (the memory broker
// holding in process, Pub/Sub). Under Ordered the portable layer then
// settles a key whose DeadLetter call did not land (failed, or its answer
// said the lease was lost) by the broker's order: it gives the key's
// later messages back, and the one the broker hands out first tells
// whether the dead letter landed (see the subscribe package). A driver
// whose Release keeps messages from this process until it stops or its
// partition moves (Kafka, Pulsar) does not implement it: there the key
// goes on after such a call.
//
// A wrapper that embeds a Subscription does not forward the method, so
// wrapping a driver turns it off unless the wrapper implements it too.
type ReleaseRedeliverer interface {
	// ReleaseRedelivers reports whether Release behaves as described; a
	// driver whose answer depends on its configuration reports false
	// when it cannot.
	ReleaseRedelivers() bool
}

// FinalAcker is implemented by Subscription drivers whose broker never
// hands this process a message again once an Ack of it has returned nil.
// Elsewhere a broker may: Pub/Sub redelivers acknowledged messages, Kafka
// replays offsets not yet committed when a partition moves, and an
// acknowledgement can reach a broker after the lease it was made under ran
// out and the message was delivered again. The portable layer remembers
// the message IDs it acknowledged (subscribe.Config.DedupeSize) so that
// such a copy does not run again; over a driver whose Acks are final it
// remembers only those whose Ack failed, which the broker redelivers when
// their leases run out, and looks up no ID until there is one. Report true
// only when an Ack that returns nil settles the message for good and an
// Ack made under a lease that was lost fails (PostgreSQL). A driver that
// does not implement it is taken not to be final.
//
// A wrapper that embeds a Subscription does not forward the method, so
// wrapping a driver keeps every acknowledged ID unless the wrapper
// implements it too.
type FinalAcker interface {
	// AcksFinal reports whether an Ack that returned nil is final as
	// described; a driver whose answer depends on its configuration
	// reports false when it cannot tell.
	AcksFinal() bool
}

// Namer is implemented by Subscription drivers that know the name of their
// subscription. subscribe puts it in keyorder.Delivery.Subscription; it is
// never a URL, so no secret of the URL reaches a handler or its logs.
type Namer interface {
	// Name returns the subscription's name as the application gave it.
	Name() string
}

// Returned is a message that ran and failed in this process and waits for
// a retry the portable layer holds in process (a broker without
// Capabilities.NativeHold, or a chain member under HoldChains) when the
// subscriber stops gracefully. It is handed to Returner.Return instead of
// Release, so that the attempts it used and its remaining retry delay are
// not forgotten by a rolling deploy.
type Returned struct {
	// Message is the message as Receive returned it.
	Message *Message
	// Attempts is how many attempts the message has used, this process's
	// runs included: its next delivery should carry Attempt = Attempts+1.
	Attempts int
	// NotBefore is when its retry is due; zero means at once.
	NotBefore time.Time
}

// Returner is implemented by Subscription drivers whose broker can carry a
// message's used attempts and remaining retry delay when the message is
// given back unsettled: the PostgreSQL row's counters, SQS's receive count
// and visibility, a Pub/Sub ack deadline, a Pulsar redelivery count, the
// Kafka commit metadata. At a graceful stop the portable layer calls Return
// for the messages that ran and wait for an in-process retry, and Release
// for the messages that never ran. A driver that cannot carry one of the
// two (say, the delay) carries what it can and documents the rest; without
// Returner those messages go through Release and both are lost, which the
// backend's guarantee table states.
type Returner interface {
	// Return gives rs back to the broker, each to be delivered again not
	// before its NotBefore and counted as its Attempts; messages of one key
	// come in key order.
	Return(ctx context.Context, rs []Returned) error
}

// Revocable is implemented by Subscription drivers whose broker can move
// messages it handed to this process to another process while they are
// unsettled (a Kafka partition revoked in a rebalance). It lets the driver
// take them back synchronously, so that a message waiting in the process
// (a parked retry, a throttled message, messages behind a held key) never
// starts here after the broker gave it to someone else.
type Revocable interface {
	// SetRevoke is called by the portable layer once, before its first
	// Receive, with the function the driver calls from its revocation
	// path. revoke selects the revoked messages with the predicate. When
	// it returns, no selected message that had not started will start in
	// this process (they are forgotten: never run, never settled, no
	// longer renewed) and every selected message that was running has
	// ended, or ctx has ended first; it returns the selected messages that
	// were still running then. The driver must not call revoke from
	// inside a call the portable layer made to it.
	SetRevoke(revoke func(ctx context.Context, selected func(*Message) bool) (stillRunning []*Message))
}
