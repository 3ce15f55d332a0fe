package watermill

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/publish"
)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// URL is the topic URL template; {topic} is the Watermill topic, and
	// there is no {group} (a publisher has no consumer group). Required.
	// Example: mem://{topic}, pubsub://project/{topic}.
	URL string
	// Keys says where a message's ordering key comes from.
	Keys KeyConfig
	// Publish configures the keyorder publisher opened per topic. Its Key
	// and MissingKey are ignored (Keys decides); nil means defaults.
	Publish *publish.Config
}

// Publisher is a message.Publisher over a keyorder backend. It opens one
// keyorder publisher per Watermill topic, on first use. It is safe for
// concurrent use.
type Publisher struct {
	tmpl template
	cfg  PublisherConfig
	pcfg publish.Config

	mu     sync.Mutex
	closed bool
	topics map[string]*topicPub
}

// topicPub is a topic's publisher, opened once.
type topicPub struct {
	once sync.Once
	p    *publish.Publisher
	err  error
}

var _ message.Publisher = (*Publisher)(nil)

// NewPublisher checks cfg (a malformed URL template fails here, matching
// keyorder.ErrBadURL or keyorder.ErrUnknownScheme) and returns a Publisher.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	t, err := parseTemplate(cfg.URL, topicSchemes())
	if err != nil {
		return nil, err
	}
	if t.hasGroup {
		return nil, fmt.Errorf("%w: watermill publisher URL template %q: a publisher has no consumer group; %s belongs in the subscriber's template",
			keyorder.ErrBadURL, redact(cfg.URL), PlaceholderGroup)
	}
	var pc publish.Config
	if cfg.Publish != nil {
		pc = *cfg.Publish
	}
	pc.Key = ""
	pc.MissingKey = cfg.Keys.missing()
	return &Publisher{tmpl: t, cfg: cfg, pcfg: pc, topics: map[string]*topicPub{}}, nil
}

// Publish publishes ms to topic and returns when the broker has them. Keys
// are resolved and every message is validated before anything is sent: a
// message without a key under Reject fails the call with
// keyorder.ErrMissingKey, one that breaks a backend limit with an error
// matching keyorder.ErrInvalidMessage, and nothing of the call is sent. A
// message's Watermill UUID is its keyorder ID; its metadata travels as
// headers.
func (p *Publisher) Publish(topic string, ms ...*message.Message) error {
	keys, err := p.cfg.Keys.resolveAll(ms)
	if err != nil {
		return err
	}
	kp, err := p.topic(topic)
	if err != nil {
		return err
	}
	kms := make([]*keyorder.Message, len(ms))
	for i, m := range ms {
		var h map[string]string
		if len(m.Metadata) > 0 {
			h = maps.Clone(map[string]string(m.Metadata))
			delete(h, keyorder.HeaderPartitionKey)
		}
		kms[i] = &keyorder.Message{ID: m.UUID, Key: keys[i], Payload: m.Payload, Headers: h}
	}
	var ids []string
	if len(kms) == 1 {
		var id string
		id, err = kp.Publish(context.Background(), kms[0])
		ids = []string{id}
	} else {
		ids, err = kp.PublishBatch(context.Background(), kms)
	}
	if err != nil {
		return fmt.Errorf("watermill: publish to %q: %w", topic, err)
	}
	for i, m := range ms {
		if m.UUID == "" {
			m.UUID = ids[i]
		}
	}
	return nil
}

// topic returns topic's keyorder publisher, opening it on first use.
func (p *Publisher) topic(topic string) (*publish.Publisher, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, keyorder.ErrClosed
	}
	tp, ok := p.topics[topic]
	if !ok {
		tp = &topicPub{}
		p.topics[topic] = tp
	}
	p.mu.Unlock()
	tp.once.Do(func() {
		cfg := p.pcfg
		tp.p, tp.err = publish.Open(context.Background(), p.tmpl.fill(topic, ""), &cfg)
	})
	if tp.err != nil {
		p.mu.Lock()
		if p.topics[topic] == tp {
			delete(p.topics, topic) // let a later call try again
		}
		p.mu.Unlock()
		return nil, fmt.Errorf("watermill: open topic %q: %w", topic, tp.err)
	}
	return tp.p, nil
}

// Close waits for queued messages to be sent and closes every topic's
// publisher. Publishing after Close fails with keyorder.ErrClosed; a second
// Close returns nil, as Watermill publishers do.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	topics := p.topics
	p.topics = nil
	p.mu.Unlock()
	var errs []error
	for _, tp := range topics {
		tp.once.Do(func() { tp.err = keyorder.ErrClosed })
		if tp.p != nil {
			errs = append(errs, tp.p.Close(context.Background()))
		}
	}
	return errors.Join(errs...)
}
