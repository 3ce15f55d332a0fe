package pubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/adapters"
	"github.com/keyorder/keyorder/policy"
)

// subscriptionDriver is the adapters.Subscription driver of one consumer of a
// Pub/Sub subscription. It pulls with the unary Pull RPC and keeps each
// message's ack deadline itself (see the package documentation).
type subscriptionDriver struct {
	client    *gpubsub.Client
	name      string // projects/p/subscriptions/s
	topic     string // projects/p/topics/t
	deadTopic string
	deadSub   string
	ordering  policy.Ordering
	lease     time.Duration
	maxBatch  int
	ownClient bool
	log       *slog.Logger

	mu       sync.Mutex
	closed   bool
	deadPub  *gpubsub.Publisher // DeadLetter
	topicPub *gpubsub.Publisher // Redrive
}

var (
	_ adapters.Subscription    = (*subscriptionDriver)(nil)
	_ adapters.DeadLetterStore = (*subscriptionDriver)(nil)
)

// delivery is a received message's AckID.
type delivery struct {
	ackID string
	mu    sync.Mutex
	// deadline is the latest time the lease is known to hold: when the
	// Pull (or ModifyAckDeadline) request was sent plus the deadline.
	deadline time.Time
}

// openSubscription returns a consuming driver for the existing subscription
// subID (an ID in the client's project or a full name). opts.Ordering must
// match the policy the subscription was created with (its label); MaxBatch
// applies; the lease is the subscription's ack deadline. The client stays
// the caller's: Close does not close it.
func openSubscription(ctx context.Context, client *gpubsub.Client, subID string, opts *SubscriptionOptions) (*subscriptionDriver, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: pubsub.OpenSubscription: nil client", keyorder.ErrInvalidConfig)
	}
	o := opts.withDefaults()
	name := subName(client.Project(), subID)
	sub, err := subscriptionOrdering(ctx, client, name, o.Ordering)
	if err != nil {
		return nil, err
	}
	project := client.Project()
	return &subscriptionDriver{
		client:    client,
		name:      name,
		topic:     sub.Topic,
		deadTopic: topicName(project, shortID(name)+"-dead"),
		deadSub:   subName(project, shortID(name)+"-dead-sub"),
		ordering:  o.Ordering,
		lease:     time.Duration(sub.AckDeadlineSeconds) * time.Second,
		maxBatch:  o.MaxBatch,
		log:       o.Logger,
	}, nil
}

var errClosed = errors.New("pubsub: subscription driver closed")

// Idle polling of Receive: the wait after an empty pull starts at
// pollMin and doubles up to pollMax.
const (
	pollMin = 20 * time.Millisecond
	pollMax = 200 * time.Millisecond
	// pullTimeout bounds one Pull request.
	pullTimeout = 30 * time.Second
)

// Receive pulls up to maxMessages, polling until at least one arrives or
// ctx is done. Messages are returned oldest publish time first (the service
// returns a pull's messages in no particular order across keys; a key's
// messages stay in key order).
//
// Each Pull asks the service to return at once (ReturnImmediately) and is
// never cancelled by ctx: a Pull cancelled in flight may have leased
// messages that the answer then never brings, and those would come back
// only when their ack deadline expires, behind their key's later messages
// on Google's emulator. When a pull brings messages after ctx is done,
// Receive returns them (the subscriber releases what it will not handle).
func (s *subscriptionDriver) Receive(ctx context.Context, maxMessages int) ([]*adapters.Message, error) {
	if maxMessages <= 0 || maxMessages > s.maxBatch {
		maxMessages = s.maxBatch
	}
	wait := pollMin
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return nil, errClosed
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		sent := time.Now()
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pullTimeout)
		resp, err := s.client.SubscriptionAdminClient.Pull(pctx, &pubsubpb.PullRequest{
			Subscription:      s.name,
			MaxMessages:       int32(maxMessages),
			ReturnImmediately: true, //nolint:staticcheck // see above: a pull must not be cancelled in flight
		})
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err
		}
		if len(resp.ReceivedMessages) > 0 {
			out := make([]*adapters.Message, 0, len(resp.ReceivedMessages))
			for _, rm := range resp.ReceivedMessages {
				out = append(out, s.fromPubSub(rm, sent))
			}
			slices.SortStableFunc(out, func(a, b *adapters.Message) int { return a.PublishTime.Compare(b.PublishTime) })
			return out, nil
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timer.C:
		}
		wait = min(2*wait, pollMax)
	}
}

func (s *subscriptionDriver) fromPubSub(rm *pubsubpb.ReceivedMessage, sent time.Time) *adapters.Message {
	pm := rm.GetMessage()
	m := s.fromMessage(pm)
	m.AckID = &delivery{ackID: rm.AckId, deadline: sent.Add(s.lease)}
	m.Attempt = max(int(rm.DeliveryAttempt), 1)
	return m
}

// fromMessage converts a Pub/Sub message: the ordering key becomes Key, the
// driver's attributes become ID and NotBefore, the rest Headers. A
// not-before attribute that does not parse (not written by keyorder) is
// logged and ignored: the message is delivered without a delay.
func (s *subscriptionDriver) fromMessage(pm *pubsubpb.PubsubMessage) *adapters.Message {
	m := &adapters.Message{
		ID:          pm.GetMessageId(),
		Key:         pm.GetOrderingKey(),
		Payload:     pm.GetData(),
		PublishTime: pm.GetPublishTime().AsTime(),
	}
	for k, v := range pm.GetAttributes() {
		switch k {
		case AttrID:
			m.ID = v
			continue
		case AttrNotBefore:
			if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
				m.NotBefore = t
			} else {
				s.log.Warn("keyorder pubsub: ignoring an unparsable not-before attribute; delivering without delay",
					"subscription", s.name, "id", m.ID, "attribute", AttrNotBefore, "err", err)
			}
			continue
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string, len(pm.GetAttributes()))
		}
		m.Headers[k] = v
	}
	return m
}

func ackIDs(ms []*adapters.Message) ([]string, []*delivery, error) {
	ids := make([]string, 0, len(ms))
	ds := make([]*delivery, 0, len(ms))
	for _, m := range ms {
		d, ok := m.AckID.(*delivery)
		if !ok || d == nil {
			return nil, nil, fmt.Errorf("pubsub: message %q was not received by this driver", m.ID)
		}
		ids = append(ids, d.ackID)
		ds = append(ds, d)
	}
	return ids, ds, nil
}

// maxAckIDsPerRequest keeps Acknowledge and ModifyAckDeadline requests
// well under the service's 512 KB request limit.
const maxAckIDsPerRequest = 1000

// Ack acknowledges ms.
func (s *subscriptionDriver) Ack(ctx context.Context, ms []*adapters.Message) error {
	ids, _, err := ackIDs(ms)
	if err != nil {
		return err
	}
	for c := range slices.Chunk(ids, maxAckIDsPerRequest) {
		if err := s.client.SubscriptionAdminClient.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: s.name, AckIds: c}); err != nil {
			return err
		}
	}
	return nil
}

// Nack is not used: the driver declares no native hold, and the subscribe
// package never asks Pub/Sub to redeliver a failed message. It returns the
// message at once regardless of delay (ModifyAckDeadline 0), as Release does.
func (s *subscriptionDriver) Nack(ctx context.Context, m *adapters.Message, delay time.Duration) error {
	return s.Release(ctx, []*adapters.Message{m})
}

// Release returns ms to Pub/Sub (ModifyAckDeadline 0) in one request, in
// the order given (the subscriber gives a key's messages oldest first).
// On an ordered subscription Pub/Sub then redelivers the key's later
// messages too, acknowledged or not; the subscriber suppresses those it
// acknowledged. Google's emulator instead queues released messages for
// redelivery in the order they were released, behind the key's messages
// never delivered yet (see the package documentation).
func (s *subscriptionDriver) Release(ctx context.Context, ms []*adapters.Message) error {
	return s.modify(ctx, ms, 0)
}

func (s *subscriptionDriver) modify(ctx context.Context, ms []*adapters.Message, d time.Duration) error {
	ids, _, err := ackIDs(ms)
	if err != nil {
		return err
	}
	for c := range slices.Chunk(ids, maxAckIDsPerRequest) {
		if err := s.client.SubscriptionAdminClient.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{
			Subscription: s.name, AckIds: c, AckDeadlineSeconds: int32(d / time.Second),
		}); err != nil {
			return err
		}
	}
	return nil
}

// ExtendLeases renews ms's ack deadlines by the subscription's ack
// deadline. A message whose deadline had already passed when the request
// was sent is reported lost instead: Pub/Sub may have redelivered it (the
// service accepts a late ModifyAckDeadline silently, so the driver keeps
// the deadline it last obtained for each message).
func (s *subscriptionDriver) ExtendLeases(ctx context.Context, ms []*adapters.Message) ([]*adapters.Message, error) {
	_, ds, err := ackIDs(ms)
	if err != nil {
		return nil, err
	}
	sent := time.Now()
	var live []*adapters.Message
	var liveD []*delivery
	var lost []*adapters.Message
	for i, d := range ds {
		d.mu.Lock()
		expired := !sent.Before(d.deadline)
		d.mu.Unlock()
		if expired {
			lost = append(lost, ms[i])
		} else {
			live = append(live, ms[i])
			liveD = append(liveD, d)
		}
	}
	if len(live) == 0 {
		return lost, nil
	}
	if err := s.modify(ctx, live, s.lease); err != nil {
		return lost, err
	}
	for _, d := range liveD {
		d.mu.Lock()
		d.deadline = sent.Add(s.lease)
		d.mu.Unlock()
	}
	return lost, nil
}

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
func (s *subscriptionDriver) DeadLetter(ctx context.Context, m *adapters.Message, reason string, attempts int) error {
	pm, err := toPubSub(&adapters.Message{ID: m.ID, Key: m.Key, Payload: m.Payload, Headers: m.Headers, NotBefore: m.NotBefore})
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
	return s.Ack(ctx, []*adapters.Message{m})
}

// Capabilities: the subscription's policy, no native hold, the
// subscription's ack deadline as lease.
func (s *subscriptionDriver) Capabilities() adapters.Capabilities {
	return adapters.Capabilities{
		Ordering:      s.ordering,
		NativeHold:    false,
		LeaseDuration: s.lease,
		MaxBatch:      s.maxBatch,
	}
}

// IsRetryable reports whether err is a transient gRPC status.
func (s *subscriptionDriver) IsRetryable(err error) bool { return isRetryable(err) }

// ErrorCode classifies err by its gRPC status code.
func (s *subscriptionDriver) ErrorCode(err error) keyorder.ErrorCode { return errorCode(err) }

// Close stops the driver. Unsettled messages are left to Pub/Sub: their ack
// deadlines expire and they are redelivered. It closes the client if the
// driver opened it (URL opener).
func (s *subscriptionDriver) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	dead, topic := s.deadPub, s.topicPub
	s.mu.Unlock()
	if dead != nil {
		dead.Stop()
		topic.Stop()
	}
	if s.ownClient {
		return s.client.Close()
	}
	return nil
}

// pullDead pulls every message currently on the dead-letter subscription,
// leased for its ack deadline. Callers settle or release them.
func (s *subscriptionDriver) pullDead(ctx context.Context) ([]*pubsubpb.ReceivedMessage, error) {
	var all []*pubsubpb.ReceivedMessage
	seen := map[string]bool{}
	for {
		resp, err := s.client.SubscriptionAdminClient.Pull(ctx, &pubsubpb.PullRequest{
			Subscription: s.deadSub, MaxMessages: 1000, ReturnImmediately: true, //nolint:staticcheck // a listing must not wait
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

func (s *subscriptionDriver) deadLetterOf(rm *pubsubpb.ReceivedMessage) adapters.DeadLetter {
	pm := rm.GetMessage()
	m := s.fromMessage(pm)
	dl := adapters.DeadLetter{DeadAt: m.PublishTime}
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
func (s *subscriptionDriver) DeadLetters(ctx context.Context, limit int) ([]adapters.DeadLetter, error) {
	rms, err := s.pullDead(ctx)
	if err != nil {
		return nil, err
	}
	defer s.releaseDead(rms)
	var out []adapters.DeadLetter
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
	}
	return n, nil
}

// Name returns the subscription's ID (adapters.Namer).
func (s *subscriptionDriver) Name() string { return shortID(s.name) }
