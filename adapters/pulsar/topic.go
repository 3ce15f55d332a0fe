package pulsar

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
)

// TopicOptions configure a Topic driver. A nil *TopicOptions means defaults.
type TopicOptions struct {
	// DisableBatching sends every message on its own. By default the
	// producer batches with pulsar.KeyBasedBatchBuilder (one key per batch).
	DisableBatching bool
	// BatchingMaxPublishDelay is how long the producer waits to fill a
	// batch. Defaults to BatchingDelayDefault.
	BatchingMaxPublishDelay time.Duration
	// MaxMessageBytes is the broker's maxMessageSize; the payload limit is
	// this less MetadataRoom. The Go client does not expose the size the
	// broker announces, so it is configuration. Defaults to
	// MaxMessageBytesDefault.
	MaxMessageBytes int
	// ProducerOptions, when set, is the template of the producer's options
	// (its Topic is replaced; a zero MaxPendingMessages means
	// MaxPendingMessagesDefault). With batching enabled its BatcherBuilderType
	// must be pulsar.KeyBasedBatchBuilder: the default batcher breaks
	// Key_Shared dispatch, and asking for it fails with ErrDefaultBatcher.
	// Setting DisableBatching in the template works as DisableBatching.
	ProducerOptions *pulsar.ProducerOptions
}

// producerOptions returns the producer's options for topic, never with the
// default batcher.
func (o *TopicOptions) producerOptions(topic string) (pulsar.ProducerOptions, error) {
	var po pulsar.ProducerOptions
	var t TopicOptions
	if o != nil {
		t = *o
	}
	if t.ProducerOptions != nil {
		po = *t.ProducerOptions
		if !po.DisableBatching && !t.DisableBatching && po.BatcherBuilderType != pulsar.KeyBasedBatchBuilder {
			return po, ErrDefaultBatcher
		}
	}
	po.Topic = topic
	if po.MaxPendingMessages == 0 {
		po.MaxPendingMessages = MaxPendingMessagesDefault
	}
	if t.DisableBatching {
		po.DisableBatching = true
	}
	if !po.DisableBatching {
		po.BatcherBuilderType = pulsar.KeyBasedBatchBuilder
		if t.BatchingMaxPublishDelay > 0 {
			po.BatchingMaxPublishDelay = t.BatchingMaxPublishDelay
		}
		if po.BatchingMaxPublishDelay <= 0 {
			po.BatchingMaxPublishDelay = BatchingDelayDefault
		}
	}
	return po, nil
}

// topicDriver is the driver.Topic driver of a Pulsar topic: one producer.
type topicDriver struct {
	client    pulsar.Client
	producer  pulsar.Producer
	maxMsg    int
	ownClient bool
}

var _ driver.Topic = (*topicDriver)(nil)

// openTopic returns a publishing driver for topic (a full name,
// persistent://tenant/namespace/topic, or a short one the client resolves
// in public/default). The client stays the caller's: Close does not close
// it. It fails with ErrDefaultBatcher if opts ask for the default batcher.
func openTopic(ctx context.Context, client pulsar.Client, topic string, opts *TopicOptions) (*topicDriver, error) {
	return openTopicOwning(ctx, client, topic, opts, false)
}

// openTopicOwning is openTopic; with own the driver owns client: it is
// closed with the driver, or when opening fails, also after ctx ended (when
// the client's late answer arrives).
func openTopicOwning(ctx context.Context, client pulsar.Client, topic string, opts *TopicOptions, own bool) (*topicDriver, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: pulsar.OpenTopic: nil client", keyorder.ErrInvalidConfig)
	}
	closeClient := func() {
		if own {
			client.Close()
		}
	}
	po, err := opts.producerOptions(topic)
	if err != nil {
		closeClient()
		return nil, err
	}
	maxMsg := MaxMessageBytesDefault
	if opts != nil && opts.MaxMessageBytes > 0 {
		maxMsg = opts.MaxMessageBytes
	}
	if err := ctx.Err(); err != nil {
		closeClient()
		return nil, fmt.Errorf("pulsar: producer for %s: %w", topic, err)
	}
	return await(ctx, "producer for "+topic, func() (*topicDriver, error) {
		p, err := client.CreateProducer(po)
		if err != nil {
			closeClient()
			return nil, fmt.Errorf("pulsar: producer for %s: %w", topic, err)
		}
		return &topicDriver{client: client, producer: p, maxMsg: maxMsg, ownClient: own}, nil
	}, func(t *topicDriver) { t.Close() })
}

// await runs open, which cannot be cancelled (the client's CreateProducer
// and Subscribe take no context and retry until their OperationTimeout,
// 30s by default), and returns its result; or, as soon as ctx ends first,
// ctx's error wrapped (errors.Is matches context.Canceled or
// context.DeadlineExceeded). A result that arrives after that is released
// with discard.
func await[T any](ctx context.Context, what string, open func() (T, error), discard func(T)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := open()
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		go func() {
			if r := <-done; r.err == nil {
				discard(r.v)
			}
		}()
		var zero T
		return zero, fmt.Errorf("pulsar: %s: %w", what, ctx.Err())
	}
}

// toProducerMessage converts a driver message: the key as key and ordering
// key, the ID and not-before time as reserved properties, headers as
// properties. Reserved or oversized properties are rejected.
func toProducerMessage(m *driver.Message) (*pulsar.ProducerMessage, error) {
	props := make(map[string]string, len(m.Headers)+2)
	size := 0
	for k, v := range m.Headers {
		if strings.HasPrefix(k, PropPrefix) {
			return nil, fmt.Errorf("%w %q: the %s prefix is reserved for the driver: %w", errBadHeader, k, PropPrefix,
				&keyorder.LimitError{Limit: "header name", Backend: "pulsar"})
		}
		props[k] = v
		size += len(k) + len(v)
	}
	if size > MaxPropertyBytes {
		return nil, fmt.Errorf("%w: %w", errBadHeader, &keyorder.LimitError{Limit: "header size", Max: MaxPropertyBytes, Got: size, Backend: "pulsar"})
	}
	if m.ID != "" {
		props[PropID] = m.ID
	}
	if !m.NotBefore.IsZero() {
		props[PropNotBefore] = m.NotBefore.UTC().Format(time.RFC3339Nano)
	}
	return &pulsar.ProducerMessage{Payload: m.Payload, Key: m.Key, OrderingKey: m.Key, Properties: props}, nil
}

// SendBatch sends ms with SendAsync, in order, and waits for every result.
// The producer keeps their order; with key-based batching a key's messages
// share batches of that key only. A failure of any message fails the
// batch (a prefix may have been sent: the portable layer may send it twice,
// never lose it).
func (t *topicDriver) SendBatch(ctx context.Context, ms []*driver.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	pms := make([]*pulsar.ProducerMessage, len(ms))
	for i, m := range ms {
		pm, err := toProducerMessage(m)
		if err != nil {
			return err
		}
		pms[i] = pm
	}
	return sendAll(ctx, t.producer, pms)
}

// sendAll sends pms asynchronously and waits for all; it returns the first
// error in send order.
func sendAll(ctx context.Context, p pulsar.Producer, pms []*pulsar.ProducerMessage) error {
	errs := make([]error, len(pms))
	var wg sync.WaitGroup
	wg.Add(len(pms))
	for i, pm := range pms {
		p.SendAsync(ctx, pm, func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
			errs[i] = err
			wg.Done()
		})
	}
	// No flush: the batching delay is short, and other keys' batches
	// sent meanwhile fill up.
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Limits returns the broker's limits as configured: keys of at most
// MaxKeyBytes, payloads of the broker's maximum message size less
// MetadataRoom, MaxBatchMessages per batch.
func (t *topicDriver) Limits() driver.Limits {
	return driver.Limits{
		Backend:          "pulsar",
		MaxKeyBytes:      MaxKeyBytes,
		KeyUTF8:          true,
		MaxPayloadBytes:  t.maxMsg - MetadataRoom,
		MaxHeaderBytes:   MaxPropertyBytes,
		MaxBatchMessages: MaxBatchMessages,
	}
}

// IsRetryable reports whether err is transient (timeouts, connection and
// lookup failures, full queues, quota back-pressure).
func (t *topicDriver) IsRetryable(err error) bool { return isRetryable(err) }

// ErrorCode classifies err by the client's Result.
func (t *topicDriver) ErrorCode(err error) keyorder.ErrorCode { return errorCode(err) }

// Close flushes and closes the producer, and the client if the driver
// opened it (URL opener).
func (t *topicDriver) Close() error {
	t.producer.Close()
	if t.ownClient {
		t.client.Close()
	}
	return nil
}
