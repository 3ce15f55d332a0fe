package kafka

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
)

// TopicOptions configure a Topic driver. A nil *TopicOptions means
// defaults.
type TopicOptions struct {
	// MaxMessageBytes is the broker's message.max.bytes (or the topic's
	// max.message.bytes) when it is not the default; the payload limit is
	// this less MetadataRoom. Defaults to MaxMessageBytesDefault. A client
	// given to OpenTopic needs kgo.ProducerBatchMaxBytes of at least this
	// (franz-go's default is 1,000,012 bytes), or OpenTopic fails with
	// keyorder.ErrInvalidConfig; the URL opener sets it from
	// max_message_size.
	MaxMessageBytes int
}

func (o *TopicOptions) maxMessageBytes() int {
	if o != nil && o.MaxMessageBytes > MetadataRoom {
		return o.MaxMessageBytes
	}
	return MaxMessageBytesDefault
}

// topicDriver is the driver.Topic driver of a Kafka topic.
type topicDriver struct {
	client    *kgo.Client
	topic     string
	maxMsg    int
	ownClient bool
}

var _ driver.Topic = (*topicDriver)(nil)

// openTopic returns a publishing driver for topic over client, which must
// be a producing client (idempotent unless the caller disabled it). The
// client stays the caller's: Close does not close it.
func openTopic(ctx context.Context, client *kgo.Client, topic string, opts *TopicOptions) (*topicDriver, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: kafka.OpenTopic: nil client", keyorder.ErrInvalidConfig)
	}
	if topic == "" {
		return nil, fmt.Errorf("%w: kafka.OpenTopic: empty topic", keyorder.ErrInvalidConfig)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("kafka: producer for %s: %w", topic, err)
	}
	maxMsg := opts.maxMessageBytes()
	// franz-go refuses, after Limits let it through, a record above the
	// client's batch limit: the limits follow the client's.
	if v, ok := client.OptValue(kgo.ProducerBatchMaxBytes).(int32); ok && int(v) < maxMsg {
		if int(v) <= MetadataRoom || opts != nil && opts.MaxMessageBytes > MetadataRoom {
			return nil, fmt.Errorf("%w: kafka.OpenTopic: the client's ProducerBatchMaxBytes (%d) is below the maximum record size %d "+
				"(TopicOptions.MaxMessageBytes, default %d): give the client kgo.ProducerBatchMaxBytes(%d)",
				keyorder.ErrInvalidConfig, v, maxMsg, MaxMessageBytesDefault, maxMsg)
		}
		maxMsg = int(v)
	}
	return &topicDriver{client: client, topic: topic, maxMsg: maxMsg}, nil
}

// toRecord converts a driver message: the key as record key (nil when
// keyless, so the partitioner spreads keyless records), the payload as a
// value that is never null (not a tombstone), the ID and
// not-before time as reserved headers, headers as record headers.
func toRecord(topic string, m *driver.Message) (*kgo.Record, error) {
	if err := checkHeaders(m.Headers); err != nil {
		return nil, err
	}
	return copyRecord(topic, m), nil
}

// copyRecord is toRecord without the header checks, for a message that
// was a record already (a dead letter, a redrive): another producer may
// have written headers the publisher's limits refuse, and refusing them
// now would leave the message undeliverable. Headers with the reserved
// prefix are dropped: they are the driver's to set.
func copyRecord(topic string, m *driver.Message) *kgo.Record {
	r := &kgo.Record{Topic: topic, Value: m.Payload}
	if r.Value == nil {
		// A null value is a tombstone to log compaction (it deletes the
		// key's records); an empty payload is an empty value.
		r.Value = []byte{}
	}
	if m.Key != "" {
		r.Key = []byte(m.Key)
	}
	r.Headers = make([]kgo.RecordHeader, 0, len(m.Headers)+2)
	if m.ID != "" {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: HeaderID, Value: []byte(m.ID)})
	}
	if !m.NotBefore.IsZero() {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: HeaderNotBefore, Value: []byte(m.NotBefore.UTC().Format(time.RFC3339Nano))})
	}
	for k, v := range m.Headers {
		if strings.HasPrefix(k, HeaderPrefix) {
			continue
		}
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
	}
	return r
}

// checkHeaders rejects reserved or oversized headers.
func checkHeaders(h map[string]string) error {
	size := 0
	for k, v := range h {
		if strings.HasPrefix(k, HeaderPrefix) {
			return fmt.Errorf("%w %q: the %s prefix is reserved for the driver: %w", errBadHeader, k, HeaderPrefix,
				&keyorder.LimitError{Limit: "header name", Backend: "kafka"})
		}
		size += len(k) + len(v)
	}
	if size > MaxHeaderBytes {
		return fmt.Errorf("%w: %w", errBadHeader, &keyorder.LimitError{Limit: "header size", Max: MaxHeaderBytes, Got: size, Backend: "kafka"})
	}
	return nil
}

// SendBatch produces ms in order and waits for every result. All records
// of a keyed batch go to the key's partition; franz-go keeps a partition's
// records in produce order and its idempotent producer keeps that order
// across retries. A failure of any record fails the batch (a prefix may
// have been written: the portable layer may send it twice, never lose it).
func (t *topicDriver) SendBatch(ctx context.Context, ms []*driver.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	rs := make([]*kgo.Record, len(ms))
	for i, m := range ms {
		r, err := toRecord(t.topic, m)
		if err != nil {
			return err
		}
		rs[i] = r
	}
	return produceAll(ctx, t.client, rs)
}

// produceAll produces rs asynchronously and waits for all; it returns the
// first error in produce order.
func produceAll(ctx context.Context, cl *kgo.Client, rs []*kgo.Record) error {
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	wg.Add(len(rs))
	for i, r := range rs {
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			errs[i] = err
			wg.Done()
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("kafka: produce to %s (record %d of %d): %w", rs[i].Topic, i+1, len(rs), err)
		}
	}
	return nil
}

// Limits returns the broker's limits as configured: keys of at most
// MaxKeyBytes, payloads of the maximum record size less MetadataRoom,
// headers of at most MaxHeaderBytes.
func (t *topicDriver) Limits() driver.Limits {
	return driver.Limits{
		Backend:          "kafka",
		MaxKeyBytes:      MaxKeyBytes,
		KeyUTF8:          true,
		MaxPayloadBytes:  t.maxMsg - MetadataRoom,
		MaxHeaderBytes:   MaxHeaderBytes,
		MaxBatchMessages: MaxBatchMessages,
		Check: func(m *keyorder.Message) error {
			if err := checkHeaders(m.Headers); err != nil {
				return err
			}
			return nil
		},
	}
}

// IsRetryable reports whether err is transient (retriable broker errors,
// record timeouts, connection failures).
func (t *topicDriver) IsRetryable(err error) bool { return isRetryable(err) }

// ErrorCode classifies err by the broker's error code.
func (t *topicDriver) ErrorCode(err error) keyorder.ErrorCode { return errorCode(err) }

// Close flushes what is buffered and closes the client if the driver
// opened it (URL opener).
func (t *topicDriver) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := t.client.Flush(ctx)
	if t.ownClient {
		t.client.Close()
	}
	if err != nil {
		return fmt.Errorf("kafka: flush %s: %w", t.topic, err)
	}
	return nil
}
