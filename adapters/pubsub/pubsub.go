// Package pubsub is keyorder's driver for Google Cloud Pub/Sub, over
// cloud.google.com/go/pubsub/v2. A message's ordering key travels as the
// Pub/Sub ordering key (Message.OrderingKey), never as an attribute.
//
// Importing the package registers the pubsub URL scheme on
// driver.DefaultMux. The client library honours PUBSUB_EMULATOR_HOST, so
// the same URLs reach Google's emulator.
//
// # URLs
//
//	pubsub://project/topic
//	pubsub://project/topic?subscription=name&ordering=ordered
//
// The first opens a topic for publishing; the second a subscription on it.
// Both create what is missing: the topic, and the subscription with the
// ordering asked for (see CreateTopic and CreateSubscription). Subscription
// parameters map one-to-one onto SubscriptionOptions: subscription (the
// subscription ID, required), ordering (parallel, exclusive or ordered;
// default ordered), lease (the ack deadline, a Go duration, 10s to 600s;
// default 30s; used only when the subscription is created), max_batch (most
// messages per Receive; default 100) and max_attempts (the dead-letter
// policy's maximum delivery attempts, 5 to 100; default 100; used only when
// the subscription is created). These are the names every backend uses for
// the same concept; the old spellings ackdeadline, maxbatch and
// maxdeliveryattempts are still accepted (a deprecation warning is logged;
// giving both spellings is an error). A topic URL takes no parameters;
// unknown parameters are rejected.
//
// # Ordering
//
// A subscription's keyorder policy is fixed when it is created: Exclusive and
// Ordered create it with EnableMessageOrdering, Parallel without. The policy
// is recorded in the subscription's labels (keyorder-ordering=ordered), so a
// consumer opening an existing subscription runs it with the policy it was
// created with; opening it with a different ordering fails with
// keyorder.CodeFailedPrecondition.
//
// Pub/Sub delivers a key's messages in publish order but does not hold a key
// the way keyorder's Ordered policy needs: a pull may hand over several
// messages of a key while none is acknowledged, and a nack (or an expired
// ack deadline) makes the service redeliver the key's later messages too.
// So the driver declares no native hold (Capabilities.NativeHold false) and
// the subscribe package holds a group in process: a failed message stays in
// its lane, its ack deadline kept alive by ExtendLeases, and is retried
// there before anything behind it. The library never nacks to retry.
// Release (the nack) is used only for messages the process will not
// handle, at shutdown or when a lease was lost; the redeliveries of already
// acknowledged messages that a nack can cause are suppressed by the
// subscriber's acknowledged-ID set.
//
// The test servers differ here, and both are run by the conformance suite.
// Google's emulator (0.8.20) hands over several messages of a key at once
// and holds the key while any of them is outstanding, but does NOT hold it
// after a nack: it queues a nacked or expired message for redelivery behind
// the key's messages not delivered yet (publish a1..a4, pull a1 a2, nack
// both: the next pull returns a3 a4 a2 a1). A message returned at shutdown
// can therefore come back behind its successors there, which the service
// does not do. pstest (cloud.google.com/go/pubsub/v2/pstest) hands out only
// the oldest unacknowledged message of each key, so a key's next message
// arrives only after the previous one is acknowledged, and Exclusive
// behaves as Ordered on it. Both hold a Pull when nothing is available:
// the emulator until messages come (measured: 15 to 100ms after a publish
// or an acknowledgement releases a key) or until about a second before the
// Pull's deadline, when it answers empty; pstest for 500ms, then it answers
// with what is there.
//
// Pub/Sub has no per-message delay. A message published with a NotBefore
// time carries it in the keyorder-not-before attribute (RFC 3339, nanosecond
// precision) and the subscriber parks its key in process until then.
//
// # Delivery semantics
//
// At least once. The subscription driver pulls with the unary Pull RPC
// rather than the client library's callback-based Receive (StreamingPull),
// and manages ack deadlines itself: the library's Receive extends the
// deadline of every message it has buffered until the process stops it, so
// a consumer that took a message and hung would hold its key forever, and
// it hides the ack IDs the driver needs to tell a lost lease. Each Pull is a
// long poll (never the deprecated ReturnImmediately, with which the service
// answers empty even when messages exist): it asks for no more messages
// than the subscriber has room for, the service answers as soon as some are
// available, and a Pull that reaches its 2-second deadline empty is simply
// sent again. When the subscriber stops (or the driver is closed) with a
// Pull in flight, the Pull is not cancelled but left to answer or reach
// its deadline, so shutdown waits at most 2 seconds for it; what it brings
// meanwhile is handed back at once (ModifyAckDeadline 0). A Pull that
// reaches its deadline on the service (or one cancelled in flight) may
// have leased messages its answer never brings: Pub/Sub redelivers them
// when their ack deadline passes. A received message is
// leased for the subscription's ack deadline (Capabilities.LeaseDuration),
// counted from when the Pull was sent or, for a Pull the service held
// longer, from one second before its answer arrived; the subscriber
// extends it with ModifyAckDeadline while the message is held or handled. A consumer that dies stops extending, the deadline passes and
// Pub/Sub redelivers the message, counting the attempt: subscriptions are
// created with a dead-letter policy (topic <subscription>-dead, at most
// max_attempts deliveries) because only then does Pub/Sub report
// delivery attempts. Below that bound the subscriber's own retry budget
// decides; DeadLetter publishes the message to <subscription>-dead with the
// keyorder-reason and keyorder-attempts attributes and then acknowledges it.
// The subscription <subscription>-dead-sub keeps those dead letters where
// DeadLetters lists them and Redrive republishes them on the topic, with
// their ordering key, after everything published meanwhile.
//
// # Attempts the service does not know
//
// A retry runs in process (the message stays leased in its lane), so
// Pub/Sub never hears of it: its delivery attempt counts deliveries, not
// handler runs. If the process dies after running a message k times, the
// redelivery arrives with the service's count (2), not k+1, and the
// subscriber starts counting from there: across a crash a message can run
// more than the subscriber's MaxAttempts times in total (up to MaxAttempts
// per delivery; the subscription's max_attempts still bounds the
// deliveries). The process cannot carry its count to the redelivery:
// Pub/Sub redelivers the message as published (attributes cannot be
// modified on redelivery), and republishing it with a count would put it
// behind its key's later messages. Handlers that must not run more than a
// fixed number of times in total keep their own count keyed by the
// message ID.
//
// The other way round, a process that dies holding several messages of a
// key gets every one of them redelivered with the service's count raised,
// though under Ordered only the first can have been running: the others
// arrive with an Attempt one higher than their runs (driver.Message.Attempt
// counts runs; the driver cannot tell which one ran).
//
// # Crashes and the start store
//
// Both gaps above close with a record of which handlers started, kept
// outside the service: give every consumer of the subscription the same
// driver.StartStore (SubscriptionOptions.StartStore; postgres.NewStartStore
// keeps one in PostgreSQL) and the subscription implements
// driver.StartRecorder. Message.Attempt of a redelivered message is then
// the runs the store recorded for it (in-process retries included), plus
// one; a crash charges only the messages whose handler started (one
// running beside the message that killed the process is charged too). The
// store is keyed by the subscription's full name and the Pub/Sub message
// ID, so a redriven copy starts from no record. It needs the delivery
// attempt, which Pub/Sub sets on subscriptions with a dead-letter policy
// (CreateSubscription sets one).
//
// What it costs: a first delivery reads nothing; a start is written 100 ms
// after the handler started, and not at all when the message is
// acknowledged before then, so fast handlers that succeed cost the store
// nothing. A message retried in process has its runs written, a returned
// one before Return hands it back, a settled one's record is deleted
// (batched), and a message delivered more often than its record explains
// (it may have run unrecorded before a crash) is recorded before its
// handler starts: a message that kills every process running it is
// dead-lettered within MaxAttempts+1 runs. While the store cannot be read,
// attempts are counted from deliveries less one; a write that fails leaves
// a run uncounted. Neither loses a message or changes order: the store only
// moves attempt counts. URLs cannot name a store.
package pubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/policy"
)

// Scheme is the URL scheme the package registers.
const Scheme = "pubsub"

// Attribute names the driver uses. User headers must not use the
// AttrPrefix.
const (
	// AttrPrefix starts every attribute name the driver reserves.
	AttrPrefix = "keyorder-"
	// AttrID carries keyorder's message ID.
	AttrID = "keyorder-id"
	// AttrNotBefore carries Message.NotBefore (RFC 3339, nanoseconds).
	AttrNotBefore = "keyorder-not-before"
	// AttrReason carries a dead letter's reason (at most 1024 bytes).
	AttrReason = "keyorder-reason"
	// AttrAttempts carries a dead letter's attempt count.
	AttrAttempts = "keyorder-attempts"
	// AttrDeadAt carries when a message was dead-lettered (RFC 3339).
	AttrDeadAt = "keyorder-dead-at"
	// LabelOrdering is the subscription label recording the keyorder policy.
	LabelOrdering = "keyorder-ordering"
)

// Limits of the service (https://cloud.google.com/pubsub/quotas).
const (
	// MaxKeyBytes is the longest ordering key.
	MaxKeyBytes = 1024
	// MaxPublishRequestBytes is the largest publish request.
	MaxPublishRequestBytes = 10_000_000
	// AttributeRoom is what MaxPayloadBytes leaves for attributes and the
	// ordering key: 100 attributes of 256-byte names and 1024-byte values
	// (the service's maxima) plus a 1 KiB key, rounded up to 130 KiB.
	AttributeRoom = 130 * 1024
	// MaxPayloadBytes is the largest payload the driver accepts, so that
	// one message with any valid attributes still fits a publish request.
	MaxPayloadBytes = MaxPublishRequestBytes - AttributeRoom
	// MaxBatchMessages is the most messages one publish request carries.
	MaxBatchMessages = 1000
	// maxAttrValue is the longest attribute value the service accepts.
	maxAttrValue = 1024
)

// Defaults for SubscriptionOptions.
const (
	// AckDeadlineDefault is SubscriptionOptions.Lease's default.
	AckDeadlineDefault = 30 * time.Second
	// MaxBatchDefault is SubscriptionOptions.MaxBatch's default.
	MaxBatchDefault = 100
	// MaxDeliveryAttemptsDefault is SubscriptionOptions.MaxDeliveryAttempts's
	// default, the service's maximum.
	MaxDeliveryAttemptsDefault = 100
	// MinAckDeadline and MaxAckDeadline bound a subscription's ack deadline.
	MinAckDeadline = 10 * time.Second
	MaxAckDeadline = 600 * time.Second
)

// PublishDelayDefault is how long the client library waits to bundle more
// messages before sending (its DelayThreshold) unless
// TopicOptions.PublishSettings says otherwise. The library's own default,
// 10 ms, is made for callers that publish one message at a time; keyorder
// gives it a key's whole batch at once and sends nothing more of the key
// until the batch is answered, so the wait only delays the key.
const PublishDelayDefault = time.Millisecond

// TopicOptions configure a Topic driver. A nil *TopicOptions means defaults.
type TopicOptions struct {
	// PublishSettings replaces the client library's publish settings
	// (batching delay, count, flow control). Defaults to
	// gpubsub.DefaultPublishSettings with DelayThreshold
	// PublishDelayDefault.
	PublishSettings *gpubsub.PublishSettings
	// Logger receives the driver's diagnostics. Defaults to slog.Default().
	Logger *slog.Logger
}

// SubscriptionOptions configure a subscription driver, and a subscription
// when it is created. A nil *SubscriptionOptions means defaults.
type SubscriptionOptions struct {
	// Ordering is the keyorder policy. When the subscription exists it must
	// match the policy recorded at creation. Defaults to policy.Ordered (the
	// zero value), as in URLs.
	Ordering policy.Ordering
	// Lease is the subscription's ack deadline, the lease of a received
	// message until it is extended (URL: lease; every backend's typed
	// options call it Lease). Used at creation; an existing subscription
	// keeps its own. Defaults to AckDeadlineDefault; rounded up to whole
	// seconds within [MinAckDeadline, MaxAckDeadline].
	Lease time.Duration
	// AckDeadline is the older name of Lease, read when Lease is not set (Lease
	// wins when both are).
	//
	// Deprecated: use Lease.
	AckDeadline time.Duration
	// MaxBatch is the most messages one Receive returns. Defaults to
	// MaxBatchDefault.
	MaxBatch int
	// MaxDeliveryAttempts bounds deliveries in the subscription's
	// dead-letter policy (5 to 100), after which Pub/Sub itself forwards a
	// message to <subscription>-dead. Used at creation. Defaults to
	// MaxDeliveryAttemptsDefault.
	MaxDeliveryAttempts int
	// Logger receives what the driver cannot return as an error (an
	// attribute it cannot parse, a dead letter it could not hand back
	// after listing). Defaults to slog.Default().
	Logger *slog.Logger
	// StartStore, when set, records which messages' handlers started, so
	// that a crash counts an attempt only against the messages that ran
	// (the subscription then implements driver.StartRecorder): Pub/Sub
	// counts every delivery, and without a store a few crashes can
	// dead-letter messages that were received but never ran (see "Crashes
	// and the start store" in the package documentation). Every consumer of
	// the subscription must be given the same store
	// (postgres.NewStartStore). Nil (the default) counts deliveries as
	// before. URLs cannot name one.
	StartStore driver.StartStore
}

func (o *SubscriptionOptions) withDefaults() SubscriptionOptions {
	var out SubscriptionOptions
	if o != nil {
		out = *o
	}
	if out.Lease > 0 {
		out.AckDeadline = out.Lease // Lease wins over its older name
	}
	if out.AckDeadline <= 0 {
		out.AckDeadline = AckDeadlineDefault
	}
	out.AckDeadline = min(max(out.AckDeadline, MinAckDeadline), MaxAckDeadline)
	if r := out.AckDeadline % time.Second; r != 0 {
		out.AckDeadline += time.Second - r
	}
	out.Lease = out.AckDeadline
	if out.MaxBatch <= 0 {
		out.MaxBatch = MaxBatchDefault
	}
	if out.MaxDeliveryAttempts <= 0 {
		out.MaxDeliveryAttempts = MaxDeliveryAttemptsDefault
	}
	out.MaxDeliveryAttempts = min(max(out.MaxDeliveryAttempts, 5), 100)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

// ErrOrderingMismatch is returned when a subscription exists with another
// keyorder policy (or without one) than the one asked for. It is classified
// as keyorder.CodeFailedPrecondition.
var ErrOrderingMismatch = errors.New("pubsub: subscription exists with another ordering")

func topicName(project, id string) string {
	if strings.HasPrefix(id, "projects/") {
		return id
	}
	return "projects/" + project + "/topics/" + id
}

func subName(project, id string) string {
	if strings.HasPrefix(id, "projects/") {
		return id
	}
	return "projects/" + project + "/subscriptions/" + id
}

// shortID returns the last path element of a resource name.
func shortID(name string) string { return name[strings.LastIndex(name, "/")+1:] }

// CreateTopic creates topicID in the client's project if it does not exist.
func CreateTopic(ctx context.Context, client *gpubsub.Client, topicID string) error {
	name := topicName(client.Project(), topicID)
	_, err := client.TopicAdminClient.GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: name})
	if status.Code(err) == codes.NotFound {
		_, err = client.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: name})
		if status.Code(err) == codes.AlreadyExists {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("pubsub: create topic %s: %w", name, err)
	}
	return nil
}

// CreateSubscription creates subscription subID on topicID with the options'
// ordering, ack deadline and dead-letter policy, together with the dead
// letter topic <subID>-dead and its subscription <subID>-dead-sub. Existing
// resources are kept; an existing subscription with another ordering fails
// with ErrOrderingMismatch.
func CreateSubscription(ctx context.Context, client *gpubsub.Client, topicID, subID string, opts *SubscriptionOptions) error {
	o := opts.withDefaults()
	project := client.Project()
	name := subName(project, subID)
	dead := topicName(project, shortID(name)+"-dead")
	if err := CreateTopic(ctx, client, dead); err != nil {
		return err
	}
	deadSub := subName(project, shortID(name)+"-dead-sub")
	if _, err := client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: deadSub, Topic: dead, AckDeadlineSeconds: 10,
		Labels: map[string]string{"keyorder-role": "dead-letters"},
	}); err != nil && status.Code(err) != codes.AlreadyExists {
		return fmt.Errorf("pubsub: create subscription %s: %w", deadSub, err)
	}
	_, err := client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name:                  name,
		Topic:                 topicName(project, topicID),
		AckDeadlineSeconds:    int32(o.Lease / time.Second),
		EnableMessageOrdering: o.Ordering.Keyed(),
		Labels:                map[string]string{LabelOrdering: o.Ordering.String()},
		DeadLetterPolicy: &pubsubpb.DeadLetterPolicy{
			DeadLetterTopic:     dead,
			MaxDeliveryAttempts: int32(o.MaxDeliveryAttempts),
		},
		MessageRetentionDuration: durationpb.New(7 * 24 * time.Hour),
	})
	if status.Code(err) == codes.AlreadyExists {
		_, err = subscriptionOrdering(ctx, client, name, o.Ordering)
		return err
	}
	if err != nil {
		return fmt.Errorf("pubsub: create subscription %s: %w", name, err)
	}
	return nil
}

// subscriptionOrdering reads an existing subscription's policy from its
// label and checks it against want.
func subscriptionOrdering(ctx context.Context, client *gpubsub.Client, name string, want policy.Ordering) (*pubsubpb.Subscription, error) {
	sub, err := client.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: name})
	if err != nil {
		return nil, fmt.Errorf("pubsub: subscription %s: %w", name, err)
	}
	label, ok := sub.Labels[LabelOrdering]
	if !ok {
		return nil, fmt.Errorf("%w: %s has no %s label (not created by keyorder; message ordering %v), want %v",
			ErrOrderingMismatch, name, LabelOrdering, sub.EnableMessageOrdering, want)
	}
	got, err := policy.ParseOrdering(label)
	if err != nil || got != want || got.Keyed() != sub.EnableMessageOrdering {
		return nil, fmt.Errorf("%w: %s was created with ordering %s (message ordering %v), want %v",
			ErrOrderingMismatch, name, label, sub.EnableMessageOrdering, want)
	}
	return sub, nil
}

// isRetryable reports whether err is a transient gRPC status.
func isRetryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted, codes.Internal:
		return !errors.Is(err, context.DeadlineExceeded)
	}
	return false
}

// errorCode classifies an error of this driver.
func errorCode(err error) keyorder.ErrorCode {
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return keyorder.CodeCanceled
	case errors.Is(err, ErrOrderingMismatch):
		return keyorder.CodeFailedPrecondition
	case errors.Is(err, errBadHeader):
		return keyorder.CodeInvalidArgument
	}
	switch status.Code(err) {
	case codes.NotFound:
		return keyorder.CodeNotFound
	case codes.InvalidArgument, codes.OutOfRange:
		return keyorder.CodeInvalidArgument
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.Internal:
		return keyorder.CodeUnavailable
	case codes.ResourceExhausted:
		return keyorder.CodeResourceExhausted
	case codes.FailedPrecondition, codes.AlreadyExists:
		return keyorder.CodeFailedPrecondition
	case codes.PermissionDenied, codes.Unauthenticated:
		return keyorder.CodePermissionDenied
	case codes.Canceled:
		return keyorder.CodeCanceled
	}
	return keyorder.CodeUnknown
}
