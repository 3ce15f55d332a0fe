package watermill

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/policy"
)

// KeyConfig says where a published message's ordering key comes from.
// Resolution, first that is set wins: the partition-key metadata, KeyFunc,
// Key.
type KeyConfig struct {
	// KeyFunc derives a key from a message that has no partition-key
	// metadata; "" falls through to Key.
	KeyFunc func(*message.Message) string
	// Key is the key fixed where the publisher is mounted.
	Key string
	// MissingKey is what happens to a message with no key. Defaults to
	// policy.Reject: Publish fails with keyorder.ErrMissingKey and nothing
	// of the call is sent.
	MissingKey policy.MissingKey
}

// missing resolves the missing-key policy.
func (c KeyConfig) missing() policy.MissingKey {
	if c.MissingKey == policy.MissingKeyDefault {
		return policy.Reject
	}
	return c.MissingKey
}

// resolve returns m's key.
func (c KeyConfig) resolve(m *message.Message) string {
	if k := m.Metadata.Get(keyorder.HeaderPartitionKey); k != "" {
		return k
	}
	if c.KeyFunc != nil {
		if k := c.KeyFunc(m); k != "" {
			return k
		}
	}
	return c.Key
}

// resolveAll resolves the keys of ms; under Reject it fails, naming the
// first message without a key, before anything is sent.
func (c KeyConfig) resolveAll(ms []*message.Message) ([]string, error) {
	keys := make([]string, len(ms))
	reject := c.missing() == policy.Reject
	for i, m := range ms {
		if m == nil {
			return nil, fmt.Errorf("%w: message %d is nil", keyorder.ErrInvalidMessage, i)
		}
		keys[i] = c.resolve(m)
		if keys[i] == "" && reject {
			return nil, fmt.Errorf("message %d (uuid %s): %w", i, m.UUID, keyorder.ErrMissingKey)
		}
	}
	return keys, nil
}

// KeyDecorator returns a message.PublisherDecorator that resolves each
// message's key by cfg and writes it to the partition-key metadata before
// the decorated publisher sees the message, so any Watermill publisher that
// reads that metadata (keyorder's, or a Kafka marshaler configured for it)
// gets the key. Under Reject a call with a keyless message fails with
// keyorder.ErrMissingKey and nothing of it reaches the decorated publisher.
func KeyDecorator(cfg KeyConfig) message.PublisherDecorator {
	return func(pub message.Publisher) (message.Publisher, error) {
		return &keyedPublisher{Publisher: pub, cfg: cfg}, nil
	}
}

type keyedPublisher struct {
	message.Publisher
	cfg KeyConfig
}

// Publish implements message.Publisher.
func (p *keyedPublisher) Publish(topic string, ms ...*message.Message) error {
	keys, err := p.cfg.resolveAll(ms)
	if err != nil {
		return err
	}
	for i, m := range ms {
		if keys[i] != "" {
			m.Metadata.Set(keyorder.HeaderPartitionKey, keys[i])
		}
	}
	return p.Publisher.Publish(topic, ms...)
}
