package pubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
)

var errBadHeader = errors.New("pubsub: invalid header")

// topicDriver is the driver.Topic driver of a Pub/Sub topic.
type topicDriver struct {
	client    *gpubsub.Client
	pub       *gpubsub.Publisher
	ownClient bool
	log       *slog.Logger
}

var _ driver.Topic = (*topicDriver)(nil)

// openTopic returns a publishing driver for topicID (an ID in the client's
// project or a full projects/p/topics/t name). The topic must exist (see
// CreateTopic). The client stays the caller's: Close does not close it.
func openTopic(ctx context.Context, client *gpubsub.Client, topicID string, opts *TopicOptions) (*topicDriver, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: pubsub.OpenTopic: nil client", keyorder.ErrInvalidConfig)
	}
	pub := client.Publisher(topicName(client.Project(), topicID))
	// keyorder hands the client a key's whole batch at once and sends
	// nothing more of that key until the batch is answered, so waiting for
	// more messages to bundle only delays the key: the default waits
	// PublishDelayDefault instead of the library's 10 ms.
	pub.PublishSettings.DelayThreshold = PublishDelayDefault
	if opts != nil && opts.PublishSettings != nil {
		pub.PublishSettings = *opts.PublishSettings
	}
	pub.EnableMessageOrdering = true
	log := slog.Default()
	if opts != nil && opts.Logger != nil {
		log = opts.Logger
	}
	return &topicDriver{client: client, pub: pub, log: log}, nil
}

// toPubSub converts a driver message, carrying the key natively and the ID
// and not-before time in attributes.
func toPubSub(m *driver.Message) (*gpubsub.Message, error) {
	attrs := make(map[string]string, len(m.Headers)+2)
	for k, v := range m.Headers {
		if strings.HasPrefix(k, AttrPrefix) {
			return nil, fmt.Errorf("%w %q: the %s prefix is reserved for the driver", errBadHeader, k, AttrPrefix)
		}
		attrs[k] = v
	}
	if m.ID != "" {
		attrs[AttrID] = m.ID
	}
	if !m.NotBefore.IsZero() {
		attrs[AttrNotBefore] = m.NotBefore.UTC().Format(time.RFC3339Nano)
	}
	return &gpubsub.Message{Data: m.Payload, Attributes: attrs, OrderingKey: m.Key}, nil
}

// SendBatch publishes ms with the client library's publisher (message
// ordering enabled) and waits for every result. The publisher may split the
// batch into several requests; a key's requests go out one at a time in
// order, so a failure leaves a prefix sent and the error covers the whole
// batch (the portable layer may then send the prefix twice, never lose it).
//
// The client library pauses an ordering key after a failed publish and
// fails the key's later publishes until ResumePublish. keyorder's publisher
// owns pausing (it pauses the key itself and lets the application resume
// it), so SendBatch resumes the key in the client library before it returns
// the error: the library's pause never outlives the batch that caused it.
func (t *topicDriver) SendBatch(ctx context.Context, ms []*driver.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	msgs := make([]*gpubsub.Message, len(ms))
	for i, m := range ms {
		pm, err := toPubSub(m)
		if err != nil {
			return err
		}
		msgs[i] = pm
	}
	results := make([]*gpubsub.PublishResult, len(msgs))
	for i, pm := range msgs {
		results[i] = t.pub.Publish(ctx, pm)
	}
	var first error
	for i, r := range results {
		if _, err := r.Get(ctx); err != nil {
			var paused gpubsub.ErrPublishingPaused
			if first == nil || (errors.As(first, &paused) && !errors.As(err, &paused)) {
				first = err
			}
			if k := msgs[i].OrderingKey; k != "" {
				t.log.Debug("keyorder pubsub: publish failed; resuming the key in the client library", "key", k, "err", err)
				defer t.pub.ResumePublish(k)
			}
		}
	}
	return first
}

// Limits returns Pub/Sub's limits: keys of at most 1024 bytes of UTF-8,
// payloads of MaxPayloadBytes (the 10 MB request limit less room for
// attributes and the key), 1000 messages per batch.
func (t *topicDriver) Limits() driver.Limits {
	return driver.Limits{
		Backend:          "pubsub",
		MaxKeyBytes:      MaxKeyBytes,
		KeyUTF8:          true,
		MaxPayloadBytes:  MaxPayloadBytes,
		MaxBatchMessages: MaxBatchMessages,
		// Pub/Sub allows 100 attributes (the driver uses 2), names of 256
		// bytes and values of 1024, and reserves names starting with goog.
		MaxHeaders:          MaxAttributes - 2,
		MaxHeaderNameBytes:  256,
		MaxHeaderValueBytes: 1024,
		Check:               checkHeaders,
	}
}

// MaxAttributes is the most attributes of one Pub/Sub message.
const MaxAttributes = 100

// checkHeaders rejects header names Pub/Sub reserves.
func checkHeaders(m *keyorder.Message) error {
	for k := range m.Headers {
		if strings.HasPrefix(strings.ToLower(k), "goog") {
			return fmt.Errorf("header name %q: Pub/Sub reserves the goog prefix", k)
		}
	}
	return nil
}

// IsRetryable reports whether err is a transient gRPC status (Unavailable,
// DeadlineExceeded from the service, ResourceExhausted, Aborted, Internal).
func (t *topicDriver) IsRetryable(err error) bool { return isRetryable(err) }

// ErrorCode classifies err by its gRPC status code.
func (t *topicDriver) ErrorCode(err error) keyorder.ErrorCode { return errorCode(err) }

// Close flushes and stops the publisher, and closes the client if the
// driver opened it (URL opener).
func (t *topicDriver) Close() error {
	t.pub.Stop()
	if t.ownClient {
		return t.client.Close()
	}
	return nil
}
