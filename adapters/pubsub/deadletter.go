package pubsub

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/keyorder/keyorder/driver"
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

// publishers returns the publishers of the dead-letter topic and of the
// subscription's topic, made on first use; errClosed after Close.
func (s *subscriptionDriver) publishers() (dead, topic *gpubsub.Publisher, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, errClosed
	}
	if s.deadPub == nil {
		s.deadPub = s.client.Publisher(s.deadTopic)
		s.deadPub.EnableMessageOrdering = true
		s.topicPub = s.client.Publisher(s.topic)
		s.topicPub.EnableMessageOrdering = true
	}
	return s.deadPub, s.topicPub, nil
}

// publishWait publishes one message and waits for the result, resuming the
// key in the client library after a failure.
func publishWait(ctx context.Context, p *gpubsub.Publisher, m *gpubsub.Message) error {
	_, err := p.Publish(ctx, m).Get(ctx)
	if err != nil && m.OrderingKey != "" {
		p.ResumePublish(m.OrderingKey)
	}
	return err
}

// DeadLetter publishes m to the topic <subscription>-dead, with its key as
// ordering key, its attributes, and keyorder-reason (cut to the service's
// 1024-byte attribute limit), keyorder-attempts and keyorder-dead-at; then
// acknowledges it. If the acknowledgement fails, m may be dead-lettered
// twice.
func (s *subscriptionDriver) DeadLetter(ctx context.Context, m *driver.Message, reason string, attempts int) error {
	pm, err := toPubSub(&driver.Message{ID: m.ID, Key: m.Key, Payload: m.Payload, Headers: m.Headers, NotBefore: m.NotBefore})
	if err != nil {
		return err
	}
	pm.Attributes[AttrReason] = truncateUTF8(reason, maxAttrValue)
	pm.Attributes[AttrAttempts] = strconv.Itoa(attempts)
	pm.Attributes[AttrDeadAt] = time.Now().UTC().Format(time.RFC3339Nano)
	dead, _, err := s.publishers()
	if err != nil {
		return err
	}
	if err := publishWait(ctx, dead, pm); err != nil {
		return fmt.Errorf("pubsub: dead-letter to %s: %w", s.deadTopic, err)
	}
	return s.Ack(ctx, []*driver.Message{m})
}

// pullDead pulls every message currently on the dead-letter subscription,
// leased for its ack deadline. Callers settle or release them.
func (s *subscriptionDriver) pullDead(ctx context.Context) ([]*pubsubpb.ReceivedMessage, error) {
	var all []*pubsubpb.ReceivedMessage
	seen := map[string]bool{}
	for {
		resp, err := s.client.SubscriptionAdminClient.Pull(ctx, &pubsubpb.PullRequest{
			Subscription: s.deadSub, MaxMessages: 1000,
			//lint:ignore SA1019 a listing must not wait for messages to arrive
			ReturnImmediately: true,
		})
		if err != nil {
			s.releaseDead(all)
			return nil, fmt.Errorf("pubsub: pull dead letters from %s: %w", s.deadSub, err)
		}
		n := 0
		for _, rm := range resp.ReceivedMessages {
			if !seen[rm.GetMessage().GetMessageId()] {
				seen[rm.GetMessage().GetMessageId()] = true
				all = append(all, rm)
				n++
			}
		}
		if n == 0 {
			break
		}
	}
	slices.SortStableFunc(all, func(a, b *pubsubpb.ReceivedMessage) int {
		return a.GetMessage().GetPublishTime().AsTime().Compare(b.GetMessage().GetPublishTime().AsTime())
	})
	return all, nil
}

// releaseDead hands pulled dead letters back to the dead-letter
// subscription. Its callers have their answer already, so a failure is
// logged: the letters stay invisible to listings until their ack deadline
// passes.
func (s *subscriptionDriver) releaseDead(rms []*pubsubpb.ReceivedMessage) {
	if len(rms) == 0 {
		return
	}
	var ids []string
	for _, rm := range rms {
		ids = append(ids, rm.AckId)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for c := range slices.Chunk(ids, maxAckIDsPerRequest) {
		if err := s.client.SubscriptionAdminClient.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{
			Subscription: s.deadSub, AckIds: c, AckDeadlineSeconds: 0,
		}); err != nil {
			s.log.Warn("keyorder pubsub: handing listed dead letters back failed; they are hidden from listings until their ack deadline passes",
				"subscription", s.deadSub, "count", len(ids), "err", err)
			return
		}
	}
}

func (s *subscriptionDriver) deadLetterOf(rm *pubsubpb.ReceivedMessage) driver.DeadLetter {
	pm := rm.GetMessage()
	m := s.fromMessage(pm)
	dl := driver.DeadLetter{DeadAt: m.PublishTime}
	for _, k := range []string{AttrReason, AttrAttempts, AttrDeadAt} {
		v, ok := m.Headers[k]
		if !ok {
			continue
		}
		delete(m.Headers, k)
		switch k {
		case AttrReason:
			dl.Reason = v
		case AttrAttempts:
			n, err := strconv.Atoi(v)
			if err != nil {
				s.log.Warn("keyorder pubsub: unparsable attempts attribute on a dead letter",
					"subscription", s.deadSub, "id", m.ID, "attribute", AttrAttempts, "err", err)
			}
			dl.Attempts = n
		case AttrDeadAt:
			if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
				dl.DeadAt = t
			}
		}
	}
	if dl.Reason == "" {
		// Forwarded by the service's dead-letter policy, not by keyorder.
		dl.Reason = "forwarded by Pub/Sub after the subscription's max delivery attempts"
	}
	if len(m.Headers) == 0 {
		m.Headers = nil
	}
	dl.Message = *m
	return dl
}

// DeadLetters lists up to limit dead letters from <subscription>-dead-sub,
// oldest first. It pulls them and returns them to the subscription at once
// (ModifyAckDeadline 0), so it sees only letters no other call is holding,
// and a listing racing another reader may miss some.
func (s *subscriptionDriver) DeadLetters(ctx context.Context, limit int) ([]driver.DeadLetter, error) {
	rms, err := s.pullDead(ctx)
	if err != nil {
		return nil, err
	}
	defer s.releaseDead(rms)
	var out []driver.DeadLetter
	for _, rm := range rms {
		if limit > 0 && len(out) >= limit {
			break
		}
		out = append(out, s.deadLetterOf(rm))
	}
	return out, nil
}

// Redrive republishes the dead letters with these IDs on the subscription's
// topic, with their ordering key, headers and ID and without their
// not-before time, after everything published meanwhile; then removes them
// from the dead letters. It returns how many were redriven. A redriven
// message reaches every subscription of the topic, not only this one.
func (s *subscriptionDriver) Redrive(ctx context.Context, ids []string) (int, error) {
	rms, err := s.pullDead(ctx)
	if err != nil {
		return 0, err
	}
	var rest []*pubsubpb.ReceivedMessage
	defer func() { s.releaseDead(rest) }()
	_, topicPub, err := s.publishers()
	if err != nil {
		rest = rms
		return 0, err
	}
	n := 0
	var done []string // the IDs redriven
	for i, rm := range rms {
		dl := s.deadLetterOf(rm)
		if !slices.Contains(ids, dl.Message.ID) {
			rest = append(rest, rm)
			continue
		}
		m := dl.Message
		m.NotBefore = time.Time{}
		pm, err := toPubSub(&m)
		if err == nil {
			err = publishWait(ctx, topicPub, pm)
		}
		if err != nil {
			rest = append(rest, rms[i:]...)
			return n, fmt.Errorf("pubsub: redrive %q to %s: %w", m.ID, s.topic, err)
		}
		if err := s.client.SubscriptionAdminClient.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: s.deadSub, AckIds: []string{rm.AckId}}); err != nil {
			rest = append(rest, rms[i+1:]...)
			return n + 1, fmt.Errorf("pubsub: redrive %q: remove dead letter: %w", m.ID, err)
		}
		n++
		done = append(done, m.ID)
	}
	return n, driver.NotDeadLetters(ids, done)
}
