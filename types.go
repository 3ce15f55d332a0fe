package keyorder

// This file: the portable descriptions of a backend that publish and
// subscribe hand to applications (limits, capabilities, dead letters,
// counts). The driver package aliases them for drivers, so an application
// never imports adapters.

import (
	"time"

	"github.com/keyorder/keyorder/policy"
)

// Limits are a backend's constraints on messages: everything a backend
// would reject that is knowable before sending. The portable publisher (and
// every other publishing path) checks them before anything is sent, so a
// message the backend cannot store fails with a *LimitError and pauses
// nothing. Zero values mean "no limit".
type Limits struct {
	// Backend names the backend in errors ("pubsub", "sqs", ...).
	Backend string
	// MaxKeyBytes is the longest ordering key, in bytes.
	MaxKeyBytes int
	// KeyUTF8 requires keys to be valid UTF-8. The portable rule requires
	// it of every backend (it is checked regardless); drivers set it to say
	// so.
	KeyUTF8 bool
	// MaxPayloadBytes is the largest payload, in bytes.
	MaxPayloadBytes int
	// PayloadRequired rejects empty payloads.
	PayloadRequired bool
	// MaxBatchMessages is the most messages one batch sent to the broker
	// may carry.
	MaxBatchMessages int
	// MaxBatchBytes is the most payload bytes one batch sent to the broker
	// may carry.
	MaxBatchBytes int
	// MaxHeaders is the most headers one message may carry.
	MaxHeaders int
	// MaxHeaderNameBytes is the longest header name, in bytes.
	MaxHeaderNameBytes int
	// MaxHeaderValueBytes is the longest header value, in bytes.
	MaxHeaderValueBytes int
	// MaxHeaderBytes is the most bytes of all header names and values of
	// one message together.
	MaxHeaderBytes int
	// Check, when set, applies the backend's own rules to a message that
	// passed every other check: the encoded size (SQS counts the base64 of
	// a binary payload and every attribute toward its message limit),
	// header names the broker reserves or cannot carry. It sees the message
	// as it will be sent: Key resolved, the partition-key header removed, ID
	// set. A non-nil result is returned as a *LimitError (Check may return
	// one itself, to name the limit and its figures). It must be the very
	// check the driver applies when sending, so that a send never fails for
	// a knowable reason on a message the limits accepted.
	Check func(m *Message) error
}

// Capabilities describe how a subscription's broker delivers.
type Capabilities struct {
	// Ordering is the subscription's policy, fixed when it was created.
	Ordering policy.Ordering
	// NativeHold is set when the broker holds an ordering group itself:
	// under Exclusive and Ordered it never leases a second message of a group
	// while one is leased (except the later members of a chain returned by
	// the same receive), a failed message returned to it is deliverable
	// again not before its retry delay, and under Ordered nothing behind it
	// in its group is delivered until it is acknowledged or dead-lettered.
	// When it is not set, the broker may deliver a group's later messages
	// while earlier ones are unsettled (in key order), and the subscriber
	// holds the group in process.
	NativeHold bool
	// HoldChains, with NativeHold under Ordered, keeps a chain (a key's
	// consecutive messages returned by one receive) in process when one of
	// its members fails: the failed message is retried in process and the
	// later members wait behind it, their leases extended, instead of the
	// failed one being returned with a delay and the rest given back
	// unrun. A failed message received alone is still returned to the
	// broker. It is for brokers that count every delivery as an attempt (SQS's
	// receive count), where a message given back unrun would count as an
	// attempt in the next process that receives it.
	HoldChains bool
	// LeaseDuration is how long a received message stays leased without
	// being extended. Zero means the driver keeps leases alive by itself.
	LeaseDuration time.Duration
	// MaxBatch is the most messages one receive returns. Zero means 1.
	MaxBatch int
	// Retry is the retry policy stored with the subscription, for backends
	// that keep one (PostgreSQL); nil when the broker stores none. A zero
	// field means the subscription does not say. The subscriber runs the
	// subscription's settings and fills only what it leaves unsaid from the
	// consumer's configuration (see subscribe.Config.Retry).
	Retry *policy.Retry
}

// DeadLetter is a dead-lettered message as a backend keeps it.
type DeadLetter struct {
	// Message is the message as it was published. Message.Key is its
	// ordering key ("" for a keyless message) and is also in
	// Headers[HeaderPartitionKey].
	Message Message
	// Reason is why the message was dead-lettered (the handler's error).
	Reason string
	// Attempts is how many attempts the message had.
	Attempts int
	// DeadAt is when the message was dead-lettered, when known.
	DeadAt time.Time
}

// HeldKey is an ordering key a backend holds: it cannot be delivered now.
type HeldKey struct {
	// Key is the ordering key.
	Key string
	// InFlight is set while a consumer holds a lease on the key.
	InFlight bool
	// Until is when the key becomes deliverable: the lease expiry while in
	// flight, else the retry or not-before time of the message holding it.
	Until time.Time
}

// Unknown is the value of a BackendStats count the backend cannot report.
const Unknown int64 = -1

// BackendStats are a subscription's counts as its backend reports them. A
// count the backend cannot report is Unknown (-1), never a guess: SQS hides a
// held group's messages, and Pub/Sub and Pulsar hold keys inside the
// consuming process.
type BackendStats struct {
	// Pending counts messages not yet acknowledged or dead-lettered,
	// including those in flight.
	Pending int64
	// Dead counts dead letters kept where they can be listed.
	Dead int64
	// Keys counts ordering keys with something pending or in flight.
	Keys int64
	// HeldKeys counts keys that cannot be delivered now: in flight, or
	// waiting for a retry or a not-before time.
	HeldKeys int64
	// Superseded counts messages a compacting subscription resolved without
	// delivering them because a newer message of their key was delivered
	// instead (PostgreSQL's SubscriptionOptions.Compaction). Zero on a
	// subscription, or a backend, that does not compact.
	Superseded int64
}

// UnknownBackendStats returns BackendStats with every count Unknown, for a
// backend to fill what it knows.
func UnknownBackendStats() BackendStats {
	return BackendStats{Pending: Unknown, Dead: Unknown, Keys: Unknown, HeldKeys: Unknown}
}
