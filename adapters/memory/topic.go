package memory

// This file: the topic side. TopicOptions, and the topic driver that
// stores each published batch on every subscription of its topic.

import (
	"context"
	"errors"
	"maps"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/memhook"
)

// TopicOptions configures a topic.
type TopicOptions struct {
	// MaxKeyBytes limits keys. Defaults to MaxKeyDefault.
	MaxKeyBytes int
	// MaxPayloadBytes limits payloads. Defaults to MaxPayloadDefault.
	MaxPayloadBytes int
	// PayloadRequired rejects empty payloads.
	PayloadRequired bool
}

// newTopicDriver returns a publishing driver for topic, creating it if needed.
func (b *Broker) newTopicDriver(name string) *topicDriver {
	b.mu.Lock()
	defer b.mu.Unlock()
	return &topicDriver{b: b, t: b.topicLocked(name, nil)}
}

// topicDriver is the driver.Topic driver of a memory topic.
type topicDriver struct {
	b *Broker
	t *topic
}

// SendBatch delivers ms to every subscription of the topic. It retains
// nothing of ms: the topic stores one copy of each payload and headers
// map, which its subscriptions share and never modify, and each delivery
// gets its own copy of the payload (see subscriptionDriver.Receive).
func (t *topicDriver) SendBatch(ctx context.Context, ms []*driver.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t.b.mu.Lock()
	fail, subs := t.t.failFn, t.t.subs
	t.b.mu.Unlock()
	if fail != nil {
		if err := fail(ms); err != nil {
			return err
		}
	}
	if len(subs) == 0 {
		return nil
	}
	cp := make([]stored, 0, 8) // on the stack for most batches
	t.t.payloadsMu.Lock()
	for _, m := range ms {
		cp = append(cp, stored{payload: t.t.payloads.Copy(m.Payload)})
	}
	t.t.payloadsMu.Unlock()
	for i, m := range ms {
		if len(m.Headers) > 0 {
			cp[i].headers = maps.Clone(m.Headers)
		}
	}
	now := time.Now()
	for _, s := range subs {
		s.enqueue(ms, cp, now)
	}
	return nil
}

// stored is the topic's copy of a sent message's payload and headers.
type stored struct {
	payload []byte
	headers map[string]string
}

// Limits returns the topic's limits.
func (t *topicDriver) Limits() driver.Limits {
	return driver.Limits{
		Backend:          "memory",
		MaxKeyBytes:      t.t.cfg.MaxKeyBytes,
		KeyUTF8:          true,
		MaxPayloadBytes:  t.t.cfg.MaxPayloadBytes,
		PayloadRequired:  t.t.cfg.PayloadRequired,
		MaxBatchMessages: 1000,
	}
}

// IsRetryable reports false: the memory broker has no transient failures
// except those a test injects, which it marks with memhook.ErrTransient.
func (t *topicDriver) IsRetryable(err error) bool { return errors.Is(err, memhook.ErrTransient) }

// ErrorCode classifies memory errors.
func (t *topicDriver) ErrorCode(err error) keyorder.ErrorCode { return errorCode(err) }

// Close does nothing.
func (t *topicDriver) Close() error { return nil }
