// Package nats is keyorder's driver for NATS JetStream, over nats.go's
// jetstream package. JetStream orders a stream, not a key: a durable
// consumer shared by several processes hands a key's messages to whichever
// process pulls next, and a negatively acknowledged message is redelivered
// behind its key's later messages. This driver adds per-key order across
// processes, with a failed key held in process while the rest go on.
//
// Importing the package registers the nats URL scheme on driver.DefaultMux.
//
// # Layout on the server
//
// A keyorder topic is a stream whose subjects are <stream>.<partition>.<key>
// (the stream's subjects are <stream>.>), with its partition count in the
// stream's metadata (MetadataPartitions). A message's ordering key travels
// in the subject's last token, base64url-encoded (RFC 4648, unpadded) after
// a "k", so any key is a legal token and decodes exactly; a key whose
// encoding would exceed MaxKeyToken bytes travels as "h" and the base64url
// SHA-256 of the key, and the key itself in the reserved header
// Keyorder-Key (as SQS maps long keys to a digest). The partition is the
// FNV-1a hash of the key modulo the partition count; keyless messages go
// round-robin and carry "_" as their last token.
//
// A subscription is one durable pull consumer per partition,
// <subscription>_p<N>, filtered on its partition's subjects, with explicit
// acks and AckWait equal to the lease.
//
// # Partition ownership
//
// One process at a time consumes a partition: it holds the partition's key
// in the subscription's lease bucket (a key-value bucket,
// keyorder_<stream>_<subscription>, whose entries expire after the owner
// TTL), created with Create and renewed with Update at its revision, which
// is the fencing token: an owner whose renewal fails (another process
// holds the key) or that has not renewed before its own deadline stops
// handing out the partition's messages at once. Processes announce
// themselves in the same bucket and share the partitions evenly; one
// holding more than its share releases a partition after its messages in
// flight are settled (see docs/nats.md for why a lease and not pinned
// priority groups).
//
// # URLs
//
//	nats://host:4222/STREAM
//	nats://host:4222/STREAM?subscription=apply&ordering=ordered&lease=30s
//
// Parameters: subscription (required to subscribe; letters, digits, '_'
// and '-'), ordering (parallel, exclusive or ordered; default ordered),
// lease (a Go duration, at least 1s; default 30s), max_batch, max_pending
// (unacknowledged messages per partition; default 1,000), create (true:
// create the stream when it does not exist) and partitions (with
// create=true; default 8), and on topic URLs msg_id (on, the default, or
// off: publish without the Nats-Msg-Id header, see TopicOptions.NoMsgID).
// Unknown parameters are rejected with an error
// matching keyorder.ErrBadURL. Without create=true a missing stream is an
// error matching keyorder.ErrNotFound.
//
// # Delivery semantics
//
// At least once. The driver declares no native hold: the subscribe package
// holds a failed message in its lane and retries it in process, and keeps
// its AckWait alive with InProgress. Attempts are the server's delivery
// count less the deliveries the driver gave back unrun (recorded in the
// subscription's state bucket, keyorder_<stream>_<subscription>_state);
// the retries run in process are not deliveries, so after a crash the
// count restarts from the server's. A process killed with SIGKILL records
// nothing: the messages it held come back, each counted once more, after
// their AckWait.
package nats

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyorder/keyorder"
)

// Scheme is the URL scheme the package registers.
const Scheme = "nats"

// Reserved headers and metadata.
const (
	// HeaderPrefix starts every header the driver reserves; applications
	// may not use it.
	HeaderPrefix = "Keyorder-"
	// HeaderID carries the message ID when it is not the Nats-Msg-Id
	// (redriven messages).
	HeaderID = "Keyorder-Id"
	// HeaderKey carries a key too long for the subject.
	HeaderKey = "Keyorder-Key"
	// HeaderHeaders carries the application's headers, JSON-encoded (NATS
	// headers cannot carry every byte an application header may hold).
	HeaderHeaders = "Keyorder-Headers"
	// HeaderNotBefore carries the not-before time (RFC 3339, nanoseconds).
	HeaderNotBefore = "Keyorder-Not-Before"
	// MetadataPartitions is the stream metadata entry with the partition
	// count.
	MetadataPartitions = "keyorder_partitions"
)

// Limits and defaults.
const (
	// MaxKeyToken is the longest encoded key carried in the subject.
	MaxKeyToken = 256
	// MaxKeyBytes is the longest ordering key.
	MaxKeyBytes = 4096
	// MaxHeaderBytes bounds the JSON of a message's headers.
	MaxHeaderBytes = 32 * 1024
	// HeaderRoom is what the driver keeps of the server's max_payload for
	// its own headers (ID, key, not-before) and the headers' JSON.
	HeaderRoom = MaxHeaderBytes + MaxKeyBytes + 2048
	// MaxBatchMessages is the most messages one SendBatch carries.
	MaxBatchMessages = 1000
	// PartitionsDefault is the partition count of a stream the driver
	// creates.
	PartitionsDefault = 8
	// AckTimeoutDefault is how long a publish waits for the server's
	// acknowledgements after its last message went out
	// (TopicOptions.AckTimeout).
	AckTimeoutDefault = 30 * time.Second
	maxReason         = 4096
)

var (
	errBadHeader = errors.New("nats: invalid header")
	errClosed    = errors.New("nats: driver closed")
	// errLost: the message's partition moved to another process, or its
	// lease ran out, before it was settled.
	errLost = errors.New("nats: the partition of this message is no longer this process's (lease lost)")
	// errBadStream: not a keyorder stream.
	errBadStream = errors.New("nats: stream is not a keyorder topic")
)

func isRetryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, jetstream.ErrTooManyStalledMsgs) || errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne)
}

func errorCode(err error) keyorder.ErrorCode {
	switch {
	case err == nil:
		return keyorder.CodeUnknown
	case errors.Is(err, errClosed), errors.Is(err, errLost), errors.Is(err, nats.ErrConnectionClosed):
		return keyorder.CodeFailedPrecondition
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return keyorder.CodeCanceled
	case errors.Is(err, errBadHeader), errors.Is(err, keyorder.ErrInvalidMessage), errors.Is(err, nats.ErrMaxPayload),
		errors.Is(err, errBadStream):
		return keyorder.CodeInvalidArgument
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrKeyNotFound):
		return keyorder.CodeNotFound
	case isRetryable(err):
		return keyorder.CodeUnavailable
	}
	return keyorder.CodeUnknown
}
