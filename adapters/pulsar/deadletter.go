package pulsar

import (
	"context"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/driverkit"
)

// truncateUTF8 cuts s to at most n bytes on a rune boundary.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// producers returns the dead-letter and topic producers, made on first use.
func (s *subscriptionDriver) producers() (dead, topic pulsar.Producer, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, errClosed
	}
	if s.deadProd == nil {
		d, err := s.client.CreateProducer(pulsar.ProducerOptions{Topic: s.deadTopic, DisableBatching: true})
		if err != nil {
			return nil, nil, fmt.Errorf("pulsar: producer for %s: %w", s.deadTopic, err)
		}
		t, err := s.client.CreateProducer(pulsar.ProducerOptions{Topic: s.topic, DisableBatching: true})
		if err != nil {
			d.Close()
			return nil, nil, fmt.Errorf("pulsar: producer for %s: %w", s.topic, err)
		}
		s.deadProd, s.topicPrd = d, t
	}
	return s.deadProd, s.topicPrd, nil
}

// DeadLetter publishes m to <topic>-<subscription>-dead with its key,
// headers, ID and keyorder-reason, keyorder-attempts and keyorder-dead-at,
// then acknowledges it. If the acknowledgement fails, m may be
// dead-lettered twice.
func (s *subscriptionDriver) DeadLetter(ctx context.Context, m *driver.Message, reason string, attempts int) error {
	if _, err := deliveryOf(m); err != nil {
		return err
	}
	pm, err := toProducerMessage(&driver.Message{ID: m.ID, Key: m.Key, Payload: m.Payload, Headers: m.Headers, NotBefore: m.NotBefore})
	if err != nil {
		return err
	}
	pm.Properties[PropReason] = truncateUTF8(reason, maxReason)
	pm.Properties[PropAttempts] = strconv.Itoa(attempts)
	pm.Properties[PropDeadAt] = time.Now().UTC().Format(time.RFC3339Nano)
	dead, _, err := s.producers()
	if err != nil {
		return err
	}
	if _, err := dead.Send(ctx, pm); err != nil {
		return fmt.Errorf("pulsar: dead-letter to %s: %w", s.deadTopic, err)
	}
	return s.Ack(ctx, []*driver.Message{m})
}

// readDead reads the whole dead-letter topic: the dead letters not redriven
// since, oldest first, with the message to republish.
func (s *subscriptionDriver) readDead(ctx context.Context) ([]driver.DeadLetter, error) {
	r, err := s.client.CreateReader(pulsar.ReaderOptions{Topic: s.deadTopic, StartMessageID: pulsar.EarliestMessageID()})
	if err != nil {
		return nil, fmt.Errorf("pulsar: reader of %s: %w", s.deadTopic, err)
	}
	defer r.Close()
	var log driverkit.DeadLog
	for r.HasNext() {
		pm, err := r.Next(ctx)
		if err != nil {
			return nil, fmt.Errorf("pulsar: read %s: %w", s.deadTopic, err)
		}
		if id, ok := pm.Properties()[PropRedriven]; ok {
			log.Redriven(id)
			continue
		}
		log.Add(deadLetterOf(pm))
	}
	return log.Letters(), nil
}

func deadLetterOf(pm pulsar.Message) driver.DeadLetter {
	return driverkit.DeadLetterOf(fromMessage(pm))
}

// deadStore is DeadLetters and Redrive over <topic>-<subscription>-dead:
// a redriven message is republished on the topic (with its key, headers
// and ID, after everything published meanwhile) and marked redriven on the
// dead-letter topic. It reaches every subscription of the topic, not only
// this one.
func (s *subscriptionDriver) deadStore() driverkit.LogStore {
	return driverkit.LogStore{
		Read:  s.readDead,
		Ready: func() error { _, _, err := s.producers(); return err },
		Republish: func(ctx context.Context, m *driver.Message) error {
			_, topic, err := s.producers()
			var pm *pulsar.ProducerMessage
			if err == nil {
				pm, err = toProducerMessage(m)
			}
			if err == nil {
				_, err = topic.Send(ctx, pm)
			}
			if err != nil {
				return fmt.Errorf("pulsar: redrive %q to %s: %w", m.ID, s.topic, err)
			}
			return nil
		},
		MarkRedriven: func(ctx context.Context, id string) error {
			dead, _, err := s.producers()
			if err == nil {
				_, err = dead.Send(ctx, &pulsar.ProducerMessage{Properties: map[string]string{PropRedriven: id}})
			}
			if err != nil {
				return fmt.Errorf("pulsar: redrive %q: mark dead letter redriven: %w", id, err)
			}
			return nil
		},
	}
}

// DeadLetters lists up to limit dead letters (all when limit <= 0), oldest
// first, reading <topic>-<subscription>-dead from its start.
func (s *subscriptionDriver) DeadLetters(ctx context.Context, limit int) ([]driver.DeadLetter, error) {
	return s.deadStore().DeadLetters(ctx, limit)
}

// Redrive republishes the dead letters with these IDs on the topic, with
// their key, headers and ID and without their not-before time, after
// everything published meanwhile, and marks each redriven on the
// dead-letter topic. A redriven message reaches every subscription of the
// topic, not only this one.
func (s *subscriptionDriver) Redrive(ctx context.Context, ids []string) (int, error) {
	return s.deadStore().Redrive(ctx, ids)
}
