// Package keyorder holds the few core types shared by every part of the
// library: the Message an application publishes, the Delivery a handler
// receives, the header that carries the ordering key, and the errors.
//
// keyorder publishes and consumes messages in order per key on the broker a
// team already runs — Google Cloud Pub/Sub, Amazon SQS FIFO, Apache Pulsar,
// Apache Kafka, NATS JetStream or a native PostgreSQL queue — and keeps the same order inside the consuming
// process with keyed worker lanes. The package is a leaf: it imports nothing
// of keyorder, so adapters and applications can depend on it freely.
//
// # Ordering
//
// An ordering group is the set of messages on one subscription that share a
// key. The subscription's policy (see package policy) decides how a group is
// delivered: Parallel (no constraint), Exclusive (at most one in flight) or
// Ordered (at most one in flight, and a failed message holds everything
// behind it until it is acknowledged or dead-lettered).
//
// # Delivery semantics
//
// Delivery is at least once. A handler returns nil to acknowledge, an error
// to retry with backoff, RetryAfter(err, d) to retry not before d, or
// Permanent(err) to dead-letter the message at once.
//
// # Keys and headers
//
// One rule holds on every backend, checked before anything is sent: keys
// and message IDs are valid UTF-8 without NUL; header names are non-empty
// valid UTF-8 without NUL and do not start with "keyorder-" (reserved for
// drivers' attributes); header values are valid UTF-8 without NUL and may
// be empty. Payloads are any bytes. A backend may narrow the rule with
// stated limits (driver.Limits), never widen it, and never changes a byte
// of what it accepted. A message that breaks the rule or a limit fails
// with a *LimitError and pauses nothing.
//
// # Errors
//
// Every error of the portable API matches one of this package's sentinels
// with errors.Is, or is the context's error, and Code reads its ErrorCode,
// as gocloud's gcerrors.Code does. Broker errors are *Error values carrying
// the driver's classification.
package keyorder
