// Package sqs is keyorder's driver for Amazon SQS FIFO queues, over
// github.com/aws/aws-sdk-go-v2/service/sqs. A message's ordering key is
// mapped onto the FIFO MessageGroupId, so SQS itself keeps a key's messages
// in order and blocks the group while one of its messages is in flight.
//
// Importing the package registers the sqs URL scheme on
// driver.DefaultMux.
//
// SQS has no topic fan-out: one FIFO queue is one subscription. The topic
// driver and the subscription driver open the same queue; every consumer of
// the queue competes for its messages. For several subscriptions on one
// stream use SNS FIFO topics fanning out to several queues (out of scope of
// this package: publish to each queue, or subscribe each queue to an SNS FIFO
// topic yourself).
//
// # URLs
//
//	sqs://QUEUE-NAME.fifo?endpoint=http://127.0.0.1:9324&region=us-east-1&ordering=ordered&lease=30s
//
// The host is the queue name (it must end in .fifo; at most 75 characters,
// so that the dead-letter queue QUEUE-NAME-dead.fifo fits SQS's 80). Topic
// and subscription URLs name the same queue; both create the queue (and its
// dead-letter queue) when it is missing. Parameters, each mapping onto one
// field of Options:
//
//   - endpoint: the SQS endpoint (ElasticMQ, LocalStack); default: AWS's.
//   - region: the AWS region; default: the SDK's (AWS_REGION, the
//     profile's region), else us-east-1.
//   - profile: the shared configuration profile to use (AWS_PROFILE
//     otherwise); a profile that does not exist is keyorder.ErrBadURL.
//   - ordering: parallel, exclusive or ordered; default ordered. Recorded
//     in the queue tag keyorder-ordering at creation; opening an existing
//     queue with another ordering fails with keyorder.CodeFailedPrecondition.
//   - lease: the lease (visibility timeout) of a received message, a Go
//     duration of at least 1s, rounded up to whole seconds; default 30s.
//   - oldest_first: true or false (default); see Ordering.
//   - wait: the long-poll wait of one ReceiveMessage call, 0s to 20s;
//     default 2s (see Delivery semantics).
//   - subscription: accepted for symmetry with other backends; it must equal
//     the queue name.
//
// The names are those every backend uses for the same concept; the old
// spellings visibility and oldestfirst are still accepted (a deprecation
// warning is logged; giving both spellings is an error). Unknown
// parameters are rejected. Credentials: the URL opener builds its
// own client with the SDK's default chain (config.LoadDefaultConfig:
// environment variables, the shared config and credentials files with the
// URL's profile, web identity (EKS), container and instance roles), and
// keeps the SDK's standard retryer (see URLOpener for why every call is
// safe to retry). Its HTTP client is NewHTTPClient's: the SDK's default
// keeps only 10 idle connections per host (net/http's default is 2, the SDK
// raises it), so with more concurrent senders or receivers every extra
// request opens a connection and closes it after use; under load (200 keys
// publishing at once) the endpoint then resets connections, which showed as
// failed publishes and paused keys against ElasticMQ. NewHTTPClient keeps
// up to MaxIdleConnsPerHostDefault (256). For anything else build a client
// yourself (pass NewHTTPClient to config.WithHTTPClient, or set
// sqs.Options.HTTPClient, when many keys publish concurrently) and use
// OpenTopic and OpenSubscription.
//
// # Ordering
//
// Under Ordered and Exclusive a message's MessageGroupId is its key when the
// key is at most 128 characters of SQS's group-id alphabet
// ([A-Za-z0-9!"#$%&'()*+,-./:;<=>?@[\]^_{|}~]), else "h-" followed by the
// unpadded base64url SHA-256 of the key: one key always lands in one group.
// The original key travels in the keyorder-key attribute and comes back as
// Message.Key. A keyless message (MissingKey Unordered) gets a group of its
// own (its ID), so keyless messages are not serialized. Under Parallel every
// message gets a group of its own, so SQS does not serialize a key either.
//
// SQS holds a group natively (Capabilities.NativeHold): under Ordered a
// failed message is returned with ChangeMessageVisibility(delay), and the
// group's later messages stay blocked until it is deleted. A failed message
// that came with other messages of its group in one receive (a chain) is
// not returned: the subscriber holds the chain in process
// (Capabilities.HoldChains), retrying the failed message there while the
// rest of the chain waits behind it, every lease extended, so that nothing
// is put back unrun (see Delivery semantics). Visibility
// timeouts are whole seconds, so a retry delay is rounded up to the next
// second (at most 12 hours). Under Exclusive, where later messages may
// overtake a failed one, a failed message is instead sent again to the end
// of its group, carrying its attempt count (keyorder-attempts) and its
// retry time as not-before time, and the original is deleted: the group
// runs on, at most one of its messages in flight, and the retry comes when
// its turn and its time have come.
//
// FIFO queues have no per-message delay. A message published with a
// NotBefore time carries it in the keyorder-not-before attribute; when it is
// received more than a second early it is put back with
// ChangeMessageVisibility for the remaining time (which holds its group)
// and not returned; the group's later messages received with it are put
// back too. Within the last second the subscriber waits in process.
//
// One ReceiveMessage call can return up to 10 messages, and SQS prefers
// several of one group. Receive asks for the batch the subscriber asked for
// in one call, and a group's messages in it form a chain, returned
// consecutively. SQS does not hand out groups oldest first (ElasticMQ,
// asked for 2 messages of the arrivals a1(A) a2(A) s1 b1(B), returns a1
// a2; asked for 1 more, returns b1 before s1). With Options.OldestFirst
// (URL parameter oldest_first=true) Receive asks for a full batch of 10 and
// chooses: the oldest group heads first (by SequenceNumber), then their
// chain tails while room is left, and puts the rest back at once; groups
// then go oldest first as far as one receive shows them. The price is a
// ChangeMessageVisibilityBatch call whenever the subscriber asks for fewer
// than SQS returned, and receive counts raised by those put-backs, which
// other consuming processes may count as attempts: OldestFirst is for a
// single consuming process. Put-back messages (Release, OldestFirst's
// surplus, not-before holds' successors) are made
// visible again with ChangeMessageVisibility(0), the last first: ElasticMQ
// hands out a group's visible message while a later one of the group is
// still in flight, so the first made visible first could be received alone
// by another consumer, and its group's rest separately.
//
// # Delivery semantics
//
// At least once. Publishing uses SendMessageBatch, at most 10 messages per
// call; a larger batch is split in order and the first failing call stops
// it. When SQS fails part of a call, SendBatch returns an error for the
// whole batch although some messages were stored: the publisher may send
// them again. MessageDeduplicationId is the keyorder message ID (mapped like
// group ids when it does not fit SQS's alphabet), so within SQS's 5-minute
// deduplication window a resend of the same ID is dropped by SQS itself:
// retries after a partial failure do not duplicate, and an application that
// reuses an ID within 5 minutes loses the second message.
//
// Attempts are counted by the library, not by SQS's redrive policy (the
// queue has none). SQS counts every receive (ApproximateReceiveCount) and
// keeps nothing a process could write about why a receive ended without
// moving the message to the end of its group, which Ordered forbids. So the
// driver avoids receives that are not attempts, and subtracts the ones it
// can recognise: Message.Attempt is the receive count, minus a not-before
// hold (a first receive more than a second before the not-before time),
// minus the put-backs this driver made itself (bounded to its last 100,000
// messages), plus the attempts an Exclusive retry carries in
// keyorder-attempts when it was sent to the end of its group. A message
// received behind its group's head under Ordered reports attempt 1 plus
// what it carries: every earlier receive of it came with that head, which
// is still queued, so none of them ran it. A failure puts nothing back
// unrun under Ordered: a chain whose member failed is held in process (see
// Ordering), and a failed message received alone goes back with
// ChangeMessageVisibility, its receive a run. What is counted is then a
// failed attempt (Nack) or a lost lease: a crash, or a lease SQS refused to
// extend. The bound on what a crash (or any lost lease) costs: one receive
// on each message the process held; a message it had not started then
// reports, wherever it is next received as its group's head, one attempt
// more than its runs: at most one per crash that held it (the package's
// tests check this bound). What can also overcount, by
// one per occurrence: a message another process received and put back
// unrun — one that arrived as its subscriber stopped past its
// ShutdownTimeout (a held chain whose retry had not come by then among
// them), the messages behind a not-before hold received with it (see
// above), or an OldestFirst surplus. (The subscriber runs what it received,
// held chains' retries included, before Run returns; see
// subscribe.Subscriber.Run.) The retries of a held chain run in process
// are no receives: after a crash or a put-back, the failed message's next
// receive counts one attempt for all of them, so it may run more than
// MaxAttempts times in all, never fewer.
//
// A received message is leased for the visibility timeout
// (Capabilities.LeaseDuration), extended by the subscriber with
// ChangeMessageVisibilityBatch; an extension SQS refuses for the message
// (receipt handle invalid, message not in flight) reports the lease lost.
// Receive long-polls for Options.WaitTime per call and is never cancelled
// in flight (a ReceiveMessage cancelled after SQS chose its messages would
// leave them invisible, holding their groups, for a whole visibility
// timeout); when ctx ends during a poll Receive returns what it got with
// ctx's error and the subscriber puts it back. Stopping a subscriber thus
// takes up to WaitTime.
//
// DeadLetter sends the message to the FIFO queue QUEUE-NAME-dead.fifo (same
// group, created when missing) with the keyorder-reason, keyorder-attempts
// and keyorder-dead-at attributes, then deletes it from the queue.
// DeadLetters and Redrive (driver.DeadLetterStore) read that queue by
// visiting every message once, moving each to the end of its group in order
// (a FIFO queue hands out nothing more of a group while one of its messages
// is in flight, so receiving alone cannot reach a group's later dead
// letters); a dead letter's SQS message ID changes each time, its keyorder
// ID, reason, attempts and time do not.
//
// Message bodies: a payload that is valid SQS text (UTF-8 of the characters
// SQS accepts) is sent as is; any other payload is sent base64-encoded with
// the attribute keyorder-encoding=base64 and decoded on receive. SQS bodies
// cannot be empty (Limits.PayloadRequired). Headers travel as String
// message attributes (Binary when the value holds a character SQS text
// excludes, so every value arrives byte for byte); names are limited to
// SQS's attribute-name alphabet (A-Z a-z 0-9 - _ .). SQS allows 10 attributes per message, of which the
// driver uses up to 5 on the queue and 6 in the dead-letter queue, so a
// message may carry at most 4 headers (MaxHeaders).
//
// # Crashes and the start store
//
// Without a record of which handlers started, the bound above lets a few
// crashes dead-letter a message that never ran: with MaxAttempts 2, two
// crashes of processes that held it behind other work are enough. Give
// every consumer of the queue the same driver.StartStore
// (Options.StartStore; postgres.NewStartStore keeps one in PostgreSQL) and
// the subscription implements driver.StartRecorder: Message.Attempt is
// then the runs the store recorded for the message's copy, plus one, plus
// what an Exclusive retry carries, and a crash charges only the messages
// whose handler started (one running beside the message that killed the
// process is charged too). The store is keyed by the queue URL and SQS's
// message ID, so a requeued or redriven copy starts from no record.
//
// What it costs: a message received for the first time reads nothing; a
// start is written 100 ms after the handler started, and not at all when
// the message is deleted before then, so fast handlers that succeed cost
// the store nothing. A failed message's runs are written before it goes
// back to SQS (Nack, Return), a settled message's record is deleted
// (batched), and a message that SQS delivered more often than its record
// explains (it may have run unrecorded before a crash) is recorded before
// its handler starts: a message that kills every process running it is
// dead-lettered within MaxAttempts+1 runs. While the store cannot be read,
// attempts are counted from receives less one (so a message charged unrun
// by a crash still gets its run); a write that fails leaves a run
// uncounted. Neither loses a message or changes order: the store only
// moves attempt counts. URLs cannot name a store.
package sqs

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// Scheme is the URL scheme the package registers.
const Scheme = "sqs"

// MaxIdleConnsPerHostDefault is how many idle connections to the endpoint
// NewHTTPClient keeps: enough for one request per key in flight with a few
// hundred keys publishing (the publisher keeps one batch per key in
// flight), instead of the SDK's 10.
const MaxIdleConnsPerHostDefault = 256

// NewHTTPClient returns the SDK's buildable HTTP client with
// MaxIdleConnsPerHost and MaxIdleConns raised to MaxIdleConnsPerHostDefault,
// the client the URL opener uses. Pass it to config.WithHTTPClient or set
// it as sqs.Options.HTTPClient when building a client of your own.
func NewHTTPClient() *awshttp.BuildableClient {
	return awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
		tr.MaxIdleConnsPerHost = MaxIdleConnsPerHostDefault
		tr.MaxIdleConns = max(tr.MaxIdleConns, MaxIdleConnsPerHostDefault)
	})
}

// Attribute names the driver uses. User headers must not use AttrPrefix.
const (
	// AttrPrefix starts every attribute name the driver reserves.
	AttrPrefix = "keyorder-"
	// AttrKey carries the original ordering key (String, or Binary when
	// the key holds characters SQS refuses in a String).
	AttrKey = "keyorder-key"
	// AttrID carries keyorder's message ID.
	AttrID = "keyorder-id"
	// AttrNotBefore carries Message.NotBefore (RFC 3339, nanoseconds).
	AttrNotBefore = "keyorder-not-before"
	// AttrEncoding is "base64" when the body is the base64 of the payload.
	AttrEncoding = "keyorder-encoding"
	// AttrReason carries a dead letter's reason (at most 1024 bytes).
	AttrReason = "keyorder-reason"
	// AttrAttempts carries a dead letter's attempt count, and the attempts
	// made before an Exclusive retry was sent to the end of its group.
	AttrAttempts = "keyorder-attempts"
	// AttrDeadAt carries when a message was dead-lettered (RFC 3339).
	AttrDeadAt = "keyorder-dead-at"
	// TagOrdering is the queue tag recording the keyorder policy.
	TagOrdering = "keyorder-ordering"
)

// Limits of SQS and of the driver.
const (
	// MaxMessageBytes is SQS's largest message, body and attributes
	// together (256 KiB, the limit ElasticMQ enforces; AWS raised its own
	// to 1 MiB in 2025).
	MaxMessageBytes = 256 * 1024
	// AttributeRoom is what MaxPayloadBytes leaves for the driver's
	// attributes (key up to MaxKeyBytes, ID up to MaxIDBytes, not-before,
	// encoding) and a few small headers: 8 KiB.
	AttributeRoom = 8 * 1024
	// MaxPayloadBytes is the largest payload the publisher accepts:
	// 262,144 - 8,192 = 253,952 bytes of SQS text. What is enforced on top
	// is the encoded size: the body as sent plus every attribute's name,
	// data type and value (the driver's included) must fit in
	// MaxMessageBytes. A payload that is not SQS text is sent
	// base64-encoded, 4/3 its size, so a binary payload fits up to about
	// 196,500 bytes with a UUID ID, a short key and no headers (the exact
	// figure depends on the attributes; the package's tests measure
	// it). publish checks the encoded size before sending (Limits.Check)
	// and rejects a message over it with a *keyorder.LimitError naming
	// "encoded size"; nothing is sent and the key is not paused.
	MaxPayloadBytes = MaxMessageBytes - AttributeRoom
	// MaxKeyBytes is the longest ordering key accepted (it travels in an
	// attribute; longer than 128 characters it maps to a digest group).
	MaxKeyBytes = 1024
	// MaxIDBytes is the longest message ID accepted.
	MaxIDBytes = 1024
	// MaxBatchMessages is the most messages of one SQS batch call.
	MaxBatchMessages = 10
	// MaxHeaders is the most headers a message may carry: SQS allows 10
	// attributes, and a dead letter carries up to 6 of the driver's (5 on
	// the queue).
	MaxHeaders = 4
	// MaxVisibility is SQS's longest visibility timeout.
	MaxVisibility = 12 * time.Hour
	// MaxQueueNameLen is the longest queue name the driver accepts, so that
	// QUEUE-dead.fifo fits SQS's 80 characters.
	MaxQueueNameLen = 75
	maxReason       = 1024
)

// Defaults for Options.
const (
	// VisibilityDefault is Options.Lease's default.
	VisibilityDefault = 30 * time.Second
	// WaitTimeDefault is Options.WaitTime's default.
	WaitTimeDefault = 2 * time.Second
)

// Options configure the drivers of one queue, and the queue when it is
// created. A nil *Options means defaults.
type Options struct {
	// Ordering is the keyorder policy. When the queue exists its tag must
	// match. Defaults to policy.Ordered (the zero value), as in URLs.
	Ordering policy.Ordering
	// Lease is the lease of a received message: the VisibilityTimeout of
	// each ReceiveMessage call, and the queue's default when created (URL:
	// lease; every backend's typed options call it Lease). At least 1s,
	// rounded up to whole seconds, at most 12h. Defaults to
	// VisibilityDefault.
	Lease time.Duration
	// Visibility is the older name of Lease, read when Lease is not set (Lease
	// wins when both are).
	//
	// Deprecated: use Lease.
	Visibility time.Duration
	// OldestFirst makes Receive ask SQS for a full batch of 10 and hand
	// out the oldest group heads among them first, putting back what the
	// subscriber did not ask for (see Ordering in the package
	// documentation). Every put-back raises the message's
	// ApproximateReceiveCount, which other processes may see as attempts:
	// use it with one consuming process. Defaults to false: Receive asks
	// SQS for what the subscriber asked (up to 10 per call, a group's
	// consecutive messages running as a chain) and takes SQS's choice.
	OldestFirst bool
	// WaitTime is the long-poll wait of one ReceiveMessage call, 0 to 20s,
	// whole seconds. Defaults to WaitTimeDefault; a negative value means 0
	// (short polling).
	WaitTime time.Duration
	// Logger receives what the driver cannot return to a caller: a
	// not-before hold or a put-back of messages the subscriber never saw
	// that SQS refused. Defaults to slog.Default().
	Logger *slog.Logger
	// StartStore, when set, records which messages' handlers started, so
	// that a crash counts an attempt only against the messages that ran
	// (the subscription then implements driver.StartRecorder): SQS counts
	// every receive, and without a store a few crashes can dead-letter
	// messages that were received but never ran (see "Crashes and the
	// start store" in the package documentation). Every consumer of the
	// queue must be given the same store (postgres.NewStartStore). Nil
	// (the default) counts receives as before. URLs cannot name one.
	StartStore driver.StartStore
}

func (o *Options) withDefaults() Options {
	var out Options
	if o != nil {
		out = *o
	}
	if out.Lease > 0 {
		out.Visibility = out.Lease // Lease wins over its older name
	}
	if out.Visibility <= 0 {
		out.Visibility = VisibilityDefault
	}
	out.Visibility = min(max(ceilSeconds(out.Visibility), time.Second), MaxVisibility)
	out.Lease = out.Visibility
	switch {
	case out.WaitTime == 0:
		out.WaitTime = WaitTimeDefault
	case out.WaitTime < 0:
		out.WaitTime = 0
	}
	out.WaitTime = min(ceilSeconds(out.WaitTime), 20*time.Second)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

func ceilSeconds(d time.Duration) time.Duration {
	if r := d % time.Second; r != 0 && d > 0 {
		d += time.Second - r
	}
	return d
}

func seconds(d time.Duration) int32 {
	d = min(max(ceilSeconds(d), 0), MaxVisibility)
	return int32(d / time.Second)
}

// ErrOrderingMismatch is returned when a queue exists with another keyorder
// policy (or without one) than the one asked for. It is classified as
// keyorder.CodeFailedPrecondition.
var ErrOrderingMismatch = errors.New("sqs: queue exists with another ordering")

var errBadMessage = errors.New("sqs: invalid message")

// groupAlphabet reports whether c may appear in a MessageGroupId or
// MessageDeduplicationId.
func groupAlphabet(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte(`!"#$%&'()*+,-./:;<=>?@[\]^_{|}~`, c) >= 0
}

// GroupID returns the MessageGroupId a key maps to: the key itself when it
// is 1 to 128 characters of SQS's alphabet and does not start with "h-" or
// "m-", else "h-" + base64url(sha256(key)). The two forms never meet: a key
// that looks like a digest ("h-...") or like a keyless message's group
// ("m-...") is itself hashed, so no two keys share a group (short of a
// SHA-256 collision) and no key shares a keyless message's group.
func GroupID(key string) string {
	if len(key) > 0 && len(key) <= 128 && !strings.HasPrefix(key, "h-") && !strings.HasPrefix(key, "m-") {
		ok := true
		for i := 0; i < len(key); i++ {
			if !groupAlphabet(key[i]) {
				ok = false
				break
			}
		}
		if ok {
			return key
		}
	}
	sum := sha256.Sum256([]byte(key))
	return "h-" + base64.RawURLEncoding.EncodeToString(sum[:])
}

// sqsText reports whether s is valid SQS text (bodies and String
// attributes): UTF-8 of #x9 #xA #xD #x20-#xD7FF #xE000-#xFFFD
// #x10000-#x10FFFF.
func sqsText(s string) bool {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n <= 1 {
			return false
		}
		switch {
		case r == 0x9 || r == 0xA || r == 0xD:
		case r >= 0x20 && r <= 0xD7FF:
		case r >= 0xE000 && r <= 0xFFFD:
		case r >= 0x10000 && r <= 0x10FFFF:
		default:
			return false
		}
		i += n
	}
	return true
}

// QueueName checks a FIFO queue name and returns its dead-letter queue's.
func deadQueueName(name string) (string, error) {
	base, ok := strings.CutSuffix(name, ".fifo")
	if !ok || base == "" {
		return "", fmt.Errorf("%w: sqs: queue name %q must end in .fifo", keyorder.ErrInvalidConfig, name)
	}
	if len(name) > MaxQueueNameLen {
		return "", fmt.Errorf("%w: sqs: queue name %q is longer than %d characters", keyorder.ErrInvalidConfig, name, MaxQueueNameLen)
	}
	return base + "-dead.fifo", nil
}

// CreateQueue creates the FIFO queue name (ending in .fifo) with the
// options' ordering tag and visibility timeout, and its dead-letter queue
// NAME-dead.fifo, and returns the queue URL. Existing queues are kept; an
// existing queue with another ordering tag fails with ErrOrderingMismatch.
func CreateQueue(ctx context.Context, client *sqs.Client, name string, opts *Options) (string, error) {
	o := opts.withDefaults()
	dead, err := deadQueueName(name)
	if err != nil {
		return "", err
	}
	if _, err := createFIFO(ctx, client, dead, nil, o.Lease); err != nil {
		return "", err
	}
	u, err := createFIFO(ctx, client, name, map[string]string{TagOrdering: o.Ordering.String()}, o.Lease)
	if err != nil {
		return "", err
	}
	if _, err := queueOrdering(ctx, client, u, &o.Ordering); err != nil {
		return "", err
	}
	return u, nil
}

func createFIFO(ctx context.Context, client *sqs.Client, name string, tags map[string]string, vis time.Duration) (string, error) {
	if u, err := client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(name)}); err == nil {
		return aws.ToString(u.QueueUrl), nil
	} else if errorCode(err) != keyorder.CodeNotFound {
		return "", fmt.Errorf("sqs: queue %s: %w", name, err)
	}
	out, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{
		QueueName: aws.String(name),
		Attributes: map[string]string{
			"FifoQueue":                 "true",
			"ContentBasedDeduplication": "false",
			"VisibilityTimeout":         strconv.Itoa(int(seconds(vis))),
			"MessageRetentionPeriod":    strconv.Itoa(14 * 24 * 3600),
		},
		Tags: tags,
	})
	if err != nil {
		return "", fmt.Errorf("sqs: create queue %s: %w", name, err)
	}
	return aws.ToString(out.QueueUrl), nil
}

// queueOrdering reads a queue's ordering tag; when want is set it must
// match.
func queueOrdering(ctx context.Context, client *sqs.Client, queueURL string, want *policy.Ordering) (policy.Ordering, error) {
	out, err := client.ListQueueTags(ctx, &sqs.ListQueueTagsInput{QueueUrl: aws.String(queueURL)})
	if err != nil {
		return 0, fmt.Errorf("sqs: queue %s tags: %w", queueURL, err)
	}
	tag, ok := out.Tags[TagOrdering]
	if !ok {
		if want == nil {
			return policy.Ordered, nil
		}
		return 0, fmt.Errorf("%w: %s has no %s tag (not created by keyorder), want %v", ErrOrderingMismatch, queueURL, TagOrdering, *want)
	}
	got, err := policy.ParseOrdering(tag)
	if err != nil || (want != nil && got != *want) {
		w := "a valid ordering"
		if want != nil {
			w = want.String()
		}
		return 0, fmt.Errorf("%w: %s was created with ordering %q, want %s", ErrOrderingMismatch, queueURL, tag, w)
	}
	return got, nil
}

// apiCode returns the error code of an SQS API error, without the
// "AWS.SimpleQueueService." prefix of the query protocol.
func apiCode(err error) string {
	var ae interface{ ErrorCode() string } // smithy.APIError, BatchEntryError
	if errors.As(err, &ae) {
		c := ae.ErrorCode()
		c = strings.TrimPrefix(c, "AWS.SimpleQueueService.")
		if i := strings.LastIndexByte(c, '#'); i >= 0 {
			c = c[i+1:]
		}
		return c
	}
	return ""
}

func isRetryable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	return errorCode(err) == keyorder.CodeUnavailable || errorCode(err) == keyorder.CodeResourceExhausted
}

// errorCode classifies an error of this driver.
func errorCode(err error) keyorder.ErrorCode {
	switch {
	case err == nil:
		return keyorder.CodeUnknown
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return keyorder.CodeCanceled
	case errors.Is(err, ErrOrderingMismatch):
		return keyorder.CodeFailedPrecondition
	case errors.Is(err, errBadMessage), errors.Is(err, keyorder.ErrInvalidConfig):
		return keyorder.CodeInvalidArgument
	case errors.Is(err, errClosed):
		return keyorder.CodeFailedPrecondition
	}
	switch apiCode(err) {
	case "QueueDoesNotExist", "NonExistentQueue", "QueueDeletedRecently":
		return keyorder.CodeNotFound
	case "InvalidParameterValue", "InvalidMessageContents", "MissingParameter", "InvalidAttributeName",
		"InvalidAttributeValue", "BatchEntryIdsNotDistinct", "EmptyBatchRequest", "TooManyEntriesInBatchRequest",
		"BatchRequestTooLong", "InvalidBatchEntryId", "UnsupportedOperation", "ValidationError", "ReceiptHandleIsInvalid",
		"InvalidIdFormat", "MessageNotInflight", "InvalidAddress":
		return keyorder.CodeInvalidArgument
	case "ThrottlingException", "Throttling", "RequestThrottled", "KmsThrottled", "OverLimit", "KmsThrottling":
		return keyorder.CodeResourceExhausted
	case "AccessDenied", "AccessDeniedException", "InvalidSecurity", "InvalidClientTokenId", "UnrecognizedClientException",
		"SignatureDoesNotMatch", "MissingAuthenticationToken", "ExpiredToken":
		return keyorder.CodePermissionDenied
	case "QueueAlreadyExists", "QueueNameExists", "PurgeQueueInProgress":
		return keyorder.CodeFailedPrecondition
	case "ServiceUnavailable", "InternalFailure", "InternalError", "RequestTimeout":
		return keyorder.CodeUnavailable
	}
	var be *BatchEntryError
	if errors.As(err, &be) && !be.SenderFault {
		return keyorder.CodeUnavailable
	}
	var re *awshttp.ResponseError
	if errors.As(err, &re) && re.HTTPStatusCode() >= 500 {
		return keyorder.CodeUnavailable
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return keyorder.CodeUnavailable
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return keyorder.CodeUnavailable
	}
	return keyorder.CodeUnknown
}
