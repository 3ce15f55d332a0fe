// Package kafka is keyorder's driver for Apache Kafka, over franz-go
// (github.com/twmb/franz-go, kgo and kadm). A message's ordering key
// travels as the Kafka record key, never as a header, so every record of a
// key lands in one partition (franz-go's default partitioner hashes keys
// with murmur2, as the Java client does) and reaches one consumer of a
// group, in order.
//
// Importing the package registers the kafka URL scheme on driver.DefaultMux.
//
// # Why a driver and not a partition per goroutine
//
// Kafka orders a partition, not a key. A consumer that runs one goroutine
// per partition (franz-go's examples) serializes every key of a partition
// behind the slowest; one that runs records in parallel must not commit an
// offset past a record that has not completed. This driver hands a
// partition's records to keyorder's keyed lanes (keys of one partition run
// in parallel, a key in order) and keeps an offset map per partition: it
// commits the highest contiguous completed offset, and carries the offsets
// completed above it in the commit's metadata string, so that a restart or
// a rebalance redelivers only the records that had not completed (the
// others are skipped on receipt).
//
// # URLs
//
//	kafka://host:9092/topic
//	kafka://host1:9092,host2:9092/topic?group=g&ordering=ordered
//
// The first opens the topic for publishing, the second a member of
// consumer group g. Several brokers go in the host part, comma-separated
// (seed brokers; the client discovers the rest). Parameters: group
// (required for a subscription; <topic>.<group>.dead must be a legal topic
// name), ordering (parallel, exclusive or ordered; default ordered), lease
// (a Go duration; default 30s), session_timeout (the group session
// timeout; default 45s, at least the broker's
// group.min.session.timeout.ms), max_batch (most records per Receive),
// max_pending (records a partition may have outstanding above its committed
// offset; default 10,000), max_message_size (the broker's message.max.bytes
// when it is not the default 1 MiB; it also raises the producer's batch
// limit and is the max.message.bytes of a topic create=true creates),
// client_id, create (true: create the topic if it does not exist)
// and partitions (with create=true: the partitions of a topic it creates).
// Unknown parameters are rejected with an error matching keyorder.ErrBadURL.
// Without create=true, a topic the cluster does not know is an error
// matching keyorder.ErrNotFound.
//
// # Publishing
//
// The producer is idempotent (franz-go's default): retried produce
// requests never duplicate or reorder a partition's records. The portable
// publisher keeps one batch per key in flight; SendBatch produces a
// batch's records in order and waits for all of them, so a key's records
// reach its partition in publish order, and franz-go packs records of many
// keys bound for one partition into one produce request. The URL opener's
// producer does not linger (kgo.ProducerLinger(0)): the publisher already
// batches per key, and franz-go's 10ms default would add 10ms to every
// key's round trip; give a client passed to OpenTopic the same option. Headers become
// record headers; the message ID and not-before time travel in the
// reserved headers keyorder-id and keyorder-not-before.
//
// # Consuming
//
// A subscription is a member of a consumer group using the
// cooperative-sticky balancer. Kafka does not hold a key after a failure
// (there is no per-record negative acknowledgement), so the driver declares
// no native hold (Capabilities.NativeHold false): the subscribe package
// holds a failed record in its lane and retries it there, before anything
// behind it of its key; other keys of the partition go on.
//
// Joining: a subscription joins its group on its first Receive, not when
// it is opened. Opening checks the topic (a missing one fails the open
// with keyorder.ErrNotFound) and the client options, nothing more. An
// operator's process (keyorder stats, dead list|show|redrive, held) opens
// a subscription only to read its dead letters and statistics and closes
// it without receiving; had it joined, each such command would rebalance
// a live group twice: the group would move partitions to the operator's
// process, wait for the live members' records in flight, and move them
// back on Close.
//
// Order across partitions: Kafka orders a partition, not a topic, and a
// fetch returns each partition's records as a block. The driver hands out
// the records it holds merged by record timestamp (ties by partition),
// each partition's in offset order, so that the subscriber, which runs
// the oldest deliverable message first, sees records fetched together in
// about publish order, as on the other backends. Only what was fetched
// together merges, and the timestamps are the producers' clocks.
//
// Backpressure: a partition may have at most max_pending records between
// its committed offset and the last one handed out, and its done runs must
// fit the commit metadata (SubscriptionOptions.MaxMetadataBytes, by default
// MaxMetadataBytesDefault, under the broker's offset.metadata.max.bytes of
// 4096; the attempt counts go first and are cut to fit): beyond either, the driver stops
// handing out that partition's records (it pauses fetching it) until the
// committed offset moves. Only such a partition is paused: a pause drops
// what the client buffered for it, and a resumed partition waits for the
// fetch in flight (up to FetchMaxWait).
//
// Revocation: when the group takes a partition away (OnPartitionsRevoked),
// the driver stops handing out its records, waits for the ones in flight to
// complete, be dead-lettered or be released (at most RevokeTimeout, and no
// longer than their lease), commits, and only then lets the rebalance go
// on: a key never runs in two processes at once unless a handler outlives
// its lease. Records still in flight after the wait are reported lost
// (ExtendLeases) and their handlers' contexts cancelled; the commit counts
// an attempt for each of them whose handler had started.
//
// Leases: a handed-out record is leased for Capabilities.LeaseDuration,
// renewed by ExtendLeases while the subscriber holds or runs it. When a
// lease runs out unrenewed (the process hangs), the driver's watchdog
// gives the member up: it commits, counting an attempt for each record
// whose handler had started (driver.StartRecorder), and leaves the group,
// so the group moves its partitions; it rejoins on the next Receive.
//
// Attempts: Kafka counts no deliveries. The driver records in the commit
// metadata that a record's handler started (driver.StartRecorder): lazily,
// in the next periodic commit, and synchronously, before the handler runs,
// for a record of a partition whose previous owner died without a final
// commit (a member commits a claim, marked in use, before it hands out a
// partition's first record; a revocation, the watchdog and Close write
// the final, clean commit). A record that was running when its process
// died comes back as its next attempt and is handed out alone, with
// nothing else in flight, so that a record that kills every process it
// runs in is dead-lettered within MaxAttempts+1 runs and charges no other
// record. The retries the subscribe package runs in process are counted
// there; Kafka keeps one attempt per process a record started in, and all
// of them (with the retry's due time) for a record given back with Return.
//
// # Delivery semantics
//
// At least once. Offsets are committed every CommitInterval, on
// revocation and on Close. A record completed after the last commit of a
// crashed process is redelivered; the subscriber's set of acknowledged IDs
// suppresses redeliveries it recognises.
//
// Dead letters: DeadLetter produces the record to the topic
// <topic>.<group>.dead with its key, headers, ID and the keyorder-reason,
// keyorder-attempts and keyorder-dead-at headers, then completes it.
// DeadLetters reads that topic from its start; Redrive produces the dead
// letter again on the topic (after everything produced meanwhile) and
// appends a keyorder-redriven marker to the dead-letter topic, so listings
// skip what was redriven.
package kafka

import (
	"context"
	"errors"
	"net"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/internal/driverkit"
)

// Scheme is the URL scheme the package registers.
const Scheme = "kafka"

// Header names the driver uses. User headers must not use HeaderPrefix.
const (
	// HeaderPrefix starts every header name the driver reserves.
	HeaderPrefix = "keyorder-"
	// HeaderID carries keyorder's message ID.
	HeaderID = "keyorder-id"
	// HeaderNotBefore carries Message.NotBefore (RFC 3339, nanoseconds).
	HeaderNotBefore = "keyorder-not-before"
	// HeaderReason carries a dead letter's reason.
	HeaderReason = driverkit.HeaderDeadReason
	// HeaderAttempts carries a dead letter's attempt count.
	HeaderAttempts = driverkit.HeaderDeadAttempts
	// HeaderDeadAt carries when a record was dead-lettered (RFC 3339).
	HeaderDeadAt = driverkit.HeaderDeadAt
	// HeaderRedriven marks, on a dead-letter topic, that the dead letter
	// with this message ID was redriven.
	HeaderRedriven = "keyorder-redriven"
)

// Limits and defaults.
const (
	// MaxMessageBytesDefault is what a record may take by default: the
	// broker's message.max.bytes is 1 MiB (1,048,588) and franz-go's
	// ProducerBatchMaxBytes 1,000,012; this stays under both.
	MaxMessageBytesDefault = 1_000_000
	// MetadataRoom is what the payload limit leaves of the maximum record
	// size for the key, headers and record overhead.
	MetadataRoom = 64 * 1024
	// MaxKeyBytes is the longest ordering key the driver accepts.
	MaxKeyBytes = 16 * 1024
	// MaxHeaderBytes bounds the total size of a record's header names and
	// values.
	MaxHeaderBytes = 32 * 1024
	// MaxBatchMessages is the most messages one SendBatch carries.
	MaxBatchMessages = 1000
	// maxReason bounds a dead letter's reason.
	maxReason = 4096
)

var (
	errBadHeader = errors.New("kafka: invalid header")
	errClosed    = errors.New("kafka: driver closed")
	// errLost: the record's partition was revoked, or its member given up,
	// before it was settled; another member redelivers it.
	errLost = errors.New("kafka: the partition of this record was revoked or its member given up (lease lost)")
)

// isRetryable reports whether err is a transient client or broker error.
func isRetryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if errors.Is(err, kgo.ErrRecordTimeout) || errors.Is(err, kgo.ErrRecordRetries) || errors.Is(err, kgo.ErrMaxBuffered) {
		return true
	}
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return ke.Retriable || ke == kerr.CoordinatorLoadInProgress || ke == kerr.RebalanceInProgress
	}
	var ne net.Error
	return errors.As(err, &ne)
}

// errorCode classifies an error of this driver.
func errorCode(err error) keyorder.ErrorCode {
	switch {
	case err == nil:
		return keyorder.CodeUnknown
	case errors.Is(err, errClosed), errors.Is(err, kgo.ErrClientClosed), errors.Is(err, errLost):
		return keyorder.CodeFailedPrecondition
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return keyorder.CodeCanceled
	case errors.Is(err, errBadHeader), errors.Is(err, keyorder.ErrInvalidMessage):
		return keyorder.CodeInvalidArgument
	case errors.Is(err, kgo.ErrRecordTimeout), errors.Is(err, kgo.ErrRecordRetries):
		return keyorder.CodeUnavailable
	case errors.Is(err, kgo.ErrMaxBuffered):
		return keyorder.CodeResourceExhausted
	}
	var ke *kerr.Error
	if errors.As(err, &ke) {
		switch ke {
		case kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidRecord, kerr.CorruptMessage,
			kerr.InvalidTopicException, kerr.InvalidRequiredAcks, kerr.InvalidCommitOffsetSize,
			kerr.InvalidSessionTimeout, kerr.InvalidGroupID, kerr.InvalidPartitions, kerr.InvalidReplicationFactor,
			kerr.InvalidConfig:
			return keyorder.CodeInvalidArgument
		case kerr.UnknownTopicOrPartition, kerr.UnknownTopicID, kerr.GroupIDNotFound:
			return keyorder.CodeNotFound
		case kerr.TopicAuthorizationFailed, kerr.GroupAuthorizationFailed, kerr.ClusterAuthorizationFailed,
			kerr.SaslAuthenticationFailed, kerr.TransactionalIDAuthorizationFailed:
			return keyorder.CodePermissionDenied
		case kerr.ThrottlingQuotaExceeded, kerr.PolicyViolation:
			return keyorder.CodeResourceExhausted
		}
		if ke.Retriable {
			return keyorder.CodeUnavailable
		}
		return keyorder.CodeUnknown
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return keyorder.CodeUnavailable
	}
	return keyorder.CodeUnknown
}
