package pubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/driver"
	"github.com/keyorder/keyorder/internal/driverkit"
	"github.com/keyorder/keyorder/policy"
)

// subscriptionDriver is the driver.Subscription driver of one consumer of a
// Pub/Sub subscription. It long-polls with the unary Pull RPC and keeps
// each message's ack deadline itself (see the package documentation).
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

	// life is cancelled by Close; closing is its Done channel.
	life     context.Context
	stop     context.CancelFunc
	closing  <-chan struct{}
	inflight sync.WaitGroup // Pulls in flight (and their hand-back after Close)

	// starts records handler starts (SubscriptionOptions.StartStore);
	// nil without a store.
	starts *driverkit.StartLog

	mu       sync.Mutex
	closed   bool
	deadPub  *gpubsub.Publisher // DeadLetter
	topicPub *gpubsub.Publisher // Redrive
}

var (
	_ driver.Subscription    = (*subscriptionDriver)(nil)
	_ driver.DeadLetterStore = (*subscriptionDriver)(nil)
	_ driver.Returner        = (*subscriptionDriver)(nil)
)

// delivery is a received message's AckID.
type delivery struct {
	ackID string
	mu    sync.Mutex
	// deadline is the latest time the lease is known to hold: when the
	// Pull (or ModifyAckDeadline) request was sent plus the deadline.
	deadline time.Time
	// mark is the start record, with a start store.
	mark *driverkit.StartMark
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
	life, stop := context.WithCancel(context.Background())
	var starts *driverkit.StartLog
	if o.StartStore != nil {
		starts = driverkit.NewStartLog(o.StartStore, name, o.Logger, 0)
	}
	return &subscriptionDriver{
		starts:    starts,
		life:      life,
		stop:      stop,
		closing:   life.Done(),
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

// The receive path: long-poll Pull (see Receive).
const (
	// pullWait is the deadline of one Pull. The service holds a Pull
	// until messages are available or the deadline is near; Google's
	// emulator answers empty about a second before it, the service ends
	// it with DEADLINE_EXCEEDED, which Receive takes as an empty answer.
	// Short enough to bound shutdown: a Pull in flight when the consumer
	// stops is not cancelled but left to end by itself.
	pullWait = 2 * time.Second
	// shutdownGrace is how long a Pull in flight when Receive's context
	// ends (or the driver is closed) is given to answer before it is
	// cancelled: its whole deadline. The emulator keeps dispatching to a
	// cancelled Pull until its own wait ends (measured: a message
	// published after the cancel stranded until its ack deadline), and
	// the subscriber hands its held messages back right after Receive
	// returns; with a shorter grace, a slow emulator gave them to the
	// cancelled Pull.
	shutdownGrace = pullWait
	// leaseSlack is how long before a Pull's answer arrived the service
	// may have leased its messages (the answer's transit): a message's
	// lease is counted from max(sent, answered-leaseSlack).
	leaseSlack = time.Second
	// emptyPause is the pause after an empty answer that came back
	// faster than a long poll can (a server that does not hold Pulls),
	// so that Receive does not spin.
	emptyPause = 20 * time.Millisecond
)

// Receive pulls up to maxMessages, waiting until at least one arrives or
// ctx is done. Messages are returned oldest publish time first (the service
// returns a pull's messages in no particular order across keys; a key's
// messages stay in key order).
//
// Each Pull is a long poll: the service answers as soon as messages are
// available (it does not set the deprecated ReturnImmediately, with which
// the service answers empty even when messages exist). A Pull in flight
// when ctx ends, or when the driver is closed, is given shutdownGrace to
// answer before it is cancelled: messages it brings then are returned
// together with ctx's error (the subscriber releases them at once), or
// released by Receive itself after Close. A Pull cancelled in flight may
// have leased messages that its answer never brings; they come back when
// their ack deadline passes (on Google's emulator behind their key's
// later messages). The grace, the Pull's whole deadline, makes that rare:
// the emulator answers every Pull within about pullWait minus a second.
func (s *subscriptionDriver) Receive(ctx context.Context, maxMessages int) ([]*driver.Message, error) {
	if maxMessages <= 0 || maxMessages > s.maxBatch {
		maxMessages = s.maxBatch
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		sent := time.Now()
		ms, err := s.pullOnce(ctx, maxMessages)
		if len(ms) > 0 {
			return ms, ctx.Err()
		}
		if err != nil {
			if errors.Is(err, errClosed) || ctx.Err() == nil {
				return nil, err
			}
			return nil, ctx.Err()
		}
		if time.Since(sent) >= emptyPause {
			continue
		}
		if timer == nil {
			timer = time.NewTimer(emptyPause)
		} else {
			timer.Reset(emptyPause)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.closing:
			return nil, errClosed
		case <-timer.C:
		}
	}
}

// pullOnce sends one Pull and converts its answer. After Close it returns
// errClosed, handing back what a Pull in flight brought; Close waits for
// that before closing the client.
func (s *subscriptionDriver) pullOnce(ctx context.Context, maxMessages int) ([]*driver.Message, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errClosed
	}
	s.inflight.Add(1)
	s.mu.Unlock()
	defer s.inflight.Done()
	sent := time.Now()
	rms, err := s.pull(ctx, maxMessages)
	answered := time.Now()
	var out []*driver.Message
	if len(rms) > 0 {
		out = make([]*driver.Message, 0, len(rms))
		for _, rm := range rms {
			out = append(out, s.fromPubSub(rm, sent, answered))
		}
		slices.SortStableFunc(out, func(a, b *driver.Message) int { return a.PublishTime.Compare(b.PublishTime) })
		if s.starts != nil {
			s.resolveRuns(ctx, out)
		}
	}
	if s.isClosed() {
		if len(out) > 0 {
			s.releaseOnClose(out)
		}
		return nil, errClosed
	}
	return out, err
}

// pull sends one long-poll Pull with a deadline of pullWait, not cancelled
// by ctx or Close until shutdownGrace after either ends. A Pull that
// reaches its own deadline is an empty answer (nil, nil).
func (s *subscriptionDriver) pull(ctx context.Context, maxMessages int) ([]*pubsubpb.ReceivedMessage, error) {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pullWait)
	defer cancel()
	var (
		once  sync.Once
		grace *time.Timer
	)
	stopping := func() { once.Do(func() { grace = time.AfterFunc(shutdownGrace, cancel) }) }
	stopOnCtx := context.AfterFunc(ctx, stopping)
	stopOnClose := context.AfterFunc(s.life, stopping)
	defer func() {
		stopOnCtx()
		stopOnClose()
		once.Do(func() {}) // waits for a stopping under way
		if grace != nil {
			grace.Stop()
		}
	}()
	resp, err := s.client.SubscriptionAdminClient.Pull(pctx, &pubsubpb.PullRequest{
		Subscription: s.name,
		MaxMessages:  int32(maxMessages),
	})
	if err != nil && len(resp.GetReceivedMessages()) == 0 && status.Code(err) == codes.DeadlineExceeded {
		// The service held the Pull to its deadline: nothing came. The
		// deadline can only be pullWait's (pctx drops ctx's), and the
		// status may come before pctx's own timer has fired, from the
		// server or from gRPC's clock.
		return nil, nil
	}
	return resp.GetReceivedMessages(), err
}

func (s *subscriptionDriver) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// releaseOnClose hands back messages a Pull brought after Close began.
func (s *subscriptionDriver) releaseOnClose(ms []*driver.Message) {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := s.modify(ctx, ms, 0); err != nil {
		s.log.Warn("keyorder pubsub: handing back messages pulled while closing failed; Pub/Sub redelivers them after their ack deadline",
			"subscription", s.name, "count", len(ms), "err", err)
	}
}

// fromPubSub converts a pulled message. Its lease is counted from when the
// service may have leased it at the earliest: when the Pull was sent, or
// leaseSlack before its answer arrived if the Pull waited longer than that.
func (s *subscriptionDriver) fromPubSub(rm *pubsubpb.ReceivedMessage, sent, answered time.Time) *driver.Message {
	pm := rm.GetMessage()
	m := s.fromMessage(pm)
	leased := sent
	if t := answered.Add(-leaseSlack); t.After(leased) {
		leased = t
	}
	m.AckID = &delivery{ackID: rm.AckId, deadline: leased.Add(s.lease)}
	m.Attempt = max(int(rm.DeliveryAttempt), 1)
	m.Copy = pm.GetMessageId() // a redrive publishes a new message
	if s.starts != nil {
		m.AckID.(*delivery).mark = &driverkit.StartMark{ID: pm.GetMessageId(), Msg: m.ID, Earlier: int(rm.DeliveryAttempt) - 1}
	}
	return m
}

// fromMessage converts a Pub/Sub message: the ordering key becomes Key, the
// driver's attributes become ID and NotBefore, the rest Headers. A
// not-before attribute that does not parse (not written by keyorder) is
// logged and ignored: the message is delivered without a delay.
func (s *subscriptionDriver) fromMessage(pm *pubsubpb.PubsubMessage) *driver.Message {
	m := &driver.Message{
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

func ackIDs(ms []*driver.Message) ([]string, []*delivery, error) {
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
func (s *subscriptionDriver) Ack(ctx context.Context, ms []*driver.Message) error {
	ids, _, err := ackIDs(ms)
	if err != nil {
		return err
	}
	for c := range slices.Chunk(ids, maxAckIDsPerRequest) {
		if err := s.client.SubscriptionAdminClient.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: s.name, AckIds: c}); err != nil {
			return err
		}
	}
	s.settled(ms)
	return nil
}

// Nack is not used: the driver declares no native hold, and the subscribe
// package never asks Pub/Sub to redeliver a failed message. It returns the
// message at once regardless of delay (ModifyAckDeadline 0), as Release does.
func (s *subscriptionDriver) Nack(ctx context.Context, m *driver.Message, delay time.Duration) error {
	s.flushRuns(ctx, m)
	return s.Release(ctx, []*driver.Message{m})
}

// Release returns ms to Pub/Sub (ModifyAckDeadline 0) in one request, in
// the order given (the subscriber gives a key's messages oldest first).
// On an ordered subscription Pub/Sub then redelivers the key's later
// messages too, acknowledged or not; the subscriber suppresses those it
// acknowledged. Google's emulator instead queues released messages for
// redelivery in the order they were released, behind the key's messages
// never delivered yet (see the package documentation).
func (s *subscriptionDriver) Release(ctx context.Context, ms []*driver.Message) error {
	return s.modify(ctx, ms, 0)
}

// Return gives back messages that ran and wait for an in-process retry
// (driver.Returner), at a graceful stop: each one's ack deadline is set to
// its remaining delay (rounded up to whole seconds, at most
// MaxAckDeadline), so Pub/Sub redelivers it when its retry is due instead
// of at once; a longer delay is cut to 600 s. The attempts are not
// carried: the redelivery comes with the service's count of deliveries,
// which the in-process retries never raised (see "Attempts the service
// does not know" in the package documentation).
func (s *subscriptionDriver) Return(ctx context.Context, rs []driver.Returned) error {
	var errs []error
	for _, r := range rs {
		d := time.Until(r.NotBefore)
		if rem := d % time.Second; rem > 0 {
			d += time.Second - rem
		}
		d = min(max(d, 0), MaxAckDeadline)
		s.flushRuns(ctx, r.Message)
		if err := s.modify(ctx, []*driver.Message{r.Message}, d); err != nil {
			errs = append(errs, fmt.Errorf("pubsub: return %s: %w", r.Message.ID, err))
		}
	}
	return errors.Join(errs...)
}

func (s *subscriptionDriver) modify(ctx context.Context, ms []*driver.Message, d time.Duration) error {
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
func (s *subscriptionDriver) ExtendLeases(ctx context.Context, ms []*driver.Message) ([]*driver.Message, error) {
	_, ds, err := ackIDs(ms)
	if err != nil {
		return nil, err
	}
	sent := time.Now()
	var live []*driver.Message
	var liveD []*delivery
	var lost []*driver.Message
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

// ReleaseRedelivers implements driver.ReleaseRedeliverer: Release nacks,
// and Pub/Sub redelivers a nacked message of an ordering key, with the
// key's later messages, in key order.
func (s *subscriptionDriver) ReleaseRedelivers() bool { return true }

// Capabilities: the subscription's policy, no native hold, the
// subscription's ack deadline as lease.
func (s *subscriptionDriver) Capabilities() driver.Capabilities {
	return driver.Capabilities{
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

// Close stops the driver. A Receive in flight returns errClosed within
// about shutdownGrace; messages its Pull brings meanwhile are handed back
// to Pub/Sub. Other unsettled messages are left to Pub/Sub: their ack
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
	// A Pull in flight gets shutdownGrace to answer; what it brings is
	// handed back before the client closes.
	s.stop()
	s.inflight.Wait()
	if s.starts != nil {
		s.starts.Close()
	}
	if dead != nil {
		dead.Stop()
		topic.Stop()
	}
	if s.ownClient {
		return s.client.Close()
	}
	return nil
}

// Name returns the subscription's ID (driver.Namer).
func (s *subscriptionDriver) Name() string { return shortID(s.name) }
