package watermill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/lanes"
	"github.com/keyorder/keyorder/subscribe"
)

// CloseTimeoutDefault is the default SubscriberConfig.CloseTimeout.
const CloseTimeoutDefault = 5 * time.Second

// ErrNacked is the handler error a Watermill Nack becomes: a failed attempt,
// retried with backoff and dead-lettered after MaxAttempts.
var ErrNacked = errors.New("watermill: message nacked")

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	// URL is the subscription URL template: {topic} is the Watermill topic,
	// {group} the consumer group. Required.
	URL string
	// Group fills {group}. Required when URL holds {group}.
	Group string
	// Subscribe configures the keyorder subscriber opened per Subscribe call
	// (workers, retry budget and backoff, logger). Workers is how many
	// messages (of different keys) may be handed to the router at once.
	// Assign is replaced by lanes.Shared: a worker only hands a message to
	// the router and waits for its settlement, so two keys must never wait
	// behind each other on one lane. ShutdownTimeout is replaced by
	// CloseTimeout. nil means defaults.
	Subscribe *subscribe.Config
	// CloseTimeout is how long closing a subscription waits for the
	// messages already handed to the router to be acked or nacked; the rest
	// go back to the broker without counting an attempt. Defaults to
	// CloseTimeoutDefault.
	CloseTimeout time.Duration
}

// Subscriber is a message.Subscriber over a keyorder backend. Each Subscribe
// call opens the keyorder subscription its template names and runs it until
// the call's context ends or the Subscriber is closed; then the returned
// channel is closed. Messages of different keys are handed to the channel
// concurrently (up to subscribe.Config.Workers at a time); a key's next
// message only after the current one is acked, or dead-lettered.
type Subscriber struct {
	tmpl    template
	cfg     SubscriberConfig
	scfg    subscribe.Config
	logger  *slog.Logger
	closing chan struct{}

	mu     sync.Mutex
	closed bool
	runs   sync.WaitGroup
}

var (
	_ message.Subscriber           = (*Subscriber)(nil)
	_ message.SubscribeInitializer = (*Subscriber)(nil)
)

// NewSubscriber checks cfg (a malformed URL template fails here, matching
// keyorder.ErrBadURL or keyorder.ErrUnknownScheme) and returns a Subscriber.
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	t, err := parseTemplate(cfg.URL, subscriptionSchemes())
	if err != nil {
		return nil, err
	}
	if t.hasGroup && cfg.Group == "" {
		return nil, fmt.Errorf("%w: watermill subscriber URL template %q holds %s but SubscriberConfig.Group is empty",
			keyorder.ErrInvalidConfig, redact(cfg.URL), PlaceholderGroup)
	}
	if cfg.CloseTimeout < 0 {
		return nil, fmt.Errorf("%w: SubscriberConfig.CloseTimeout must not be negative", keyorder.ErrInvalidConfig)
	}
	if cfg.CloseTimeout == 0 {
		cfg.CloseTimeout = CloseTimeoutDefault
	}
	sc := subscribe.Config{}
	if cfg.Subscribe != nil {
		sc = *cfg.Subscribe
	}
	// The Subscriber waits for the router itself (CloseTimeout), then
	// stops the keyorder subscriber at once: handlers still waiting for an
	// ack see their context end and their messages go back unharmed.
	sc.ShutdownTimeout = time.Nanosecond
	sc.Assign = lanes.Shared
	logger := sc.Logger
	if logger == nil {
		logger = slog.Default()
	}
	return &Subscriber{tmpl: t, cfg: cfg, scfg: sc, logger: logger, closing: make(chan struct{})}, nil
}

// url fills the template for topic.
func (s *Subscriber) url(topic string) string { return s.tmpl.fill(topic, s.cfg.Group) }

// SubscribeInitialize creates the subscription for topic (on backends that
// create on open) without consuming, so that messages published before the
// first Subscribe are kept for it.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	cfg := s.scfg
	ks, err := subscribe.Open(context.Background(), s.url(topic), &cfg)
	if err != nil {
		return fmt.Errorf("watermill: initialize subscription for topic %q: %w", topic, err)
	}
	return ks.Close(context.Background())
}

// Subscribe opens topic's subscription and returns the channel its messages
// arrive on. The channel is closed when ctx ends or Close is called, after
// the messages handed out have been settled or CloseTimeout has passed.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, keyorder.ErrClosed
	}
	s.runs.Add(1)
	s.mu.Unlock()
	cfg := s.scfg
	ks, err := subscribe.Open(ctx, s.url(topic), &cfg)
	if err != nil {
		s.runs.Done()
		return nil, fmt.Errorf("watermill: subscribe to topic %q: %w", topic, err)
	}
	r := &run{s: s, ks: ks, ctx: ctx, out: make(chan *message.Message), stopping: make(chan struct{})}
	go r.loop(topic)
	return r.out, nil
}

// Close closes every subscription (see Subscribe) and waits for them. A
// second Close returns nil.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	s.mu.Unlock()
	s.runs.Wait()
	return nil
}

// run is one Subscribe call.
type run struct {
	s        *Subscriber
	ks       *subscribe.Subscriber
	ctx      context.Context // the Subscribe call's: its values reach the messages
	out      chan *message.Message
	stopping chan struct{} // closed when the subscription starts closing

	mu     sync.Mutex
	handed int           // messages handed to the router and not settled
	idle   chan struct{} // closed when handed drops to 0 while stopping
	stop   bool
}

func (r *run) loop(topic string) {
	defer r.s.runs.Done()
	runCtx, cancel := context.WithCancel(context.WithoutCancel(r.ctx))
	defer cancel()
	go func() {
		select {
		case <-r.ctx.Done():
		case <-r.s.closing:
		}
		// Stop handing out messages, give the router CloseTimeout to settle
		// the ones it has, then stop the keyorder subscriber.
		idle := r.beginStop()
		t := time.NewTimer(r.s.cfg.CloseTimeout)
		select {
		case <-idle:
		case <-t.C:
		}
		t.Stop()
		cancel()
	}()
	if err := r.ks.Run(runCtx, r.handle); err != nil {
		r.s.logger.Error("keyorder: watermill subscription failed", "topic", topic, "err", err)
	}
	cancel()
	close(r.out)
	if err := r.ks.Close(context.Background()); err != nil {
		r.s.logger.Warn("keyorder: closing watermill subscription", "topic", topic, "err", err)
	}
}

// beginStop marks the run stopping and returns a channel closed once no
// message is handed out.
func (r *run) beginStop() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stop = true
	close(r.stopping)
	ch := make(chan struct{})
	if r.handed == 0 {
		close(ch)
	} else {
		r.idle = ch
	}
	return ch
}

// hand counts a message about to be handed out; false once stopping.
func (r *run) hand() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stop {
		return false
	}
	r.handed++
	return true
}

// settled uncounts a handed message.
func (r *run) settled() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.handed--
	if r.handed == 0 && r.idle != nil {
		close(r.idle)
		r.idle = nil
	}
}

// handle hands one delivery to the router and waits for its Ack or Nack.
// When the subscription stops first, it waits for its context to end, so
// that package subscribe gives the message back without counting an
// attempt.
func (r *run) handle(hctx context.Context, d *keyorder.Delivery) error {
	msg := message.NewMessage(d.ID, d.Payload)
	for k, v := range d.Headers {
		msg.Metadata.Set(k, v)
	}
	if d.Key != "" {
		// A Delivery carries its key as a field only; Watermill handlers
		// read it from the metadata.
		msg.Metadata.Set(keyorder.HeaderPartitionKey, d.Key)
	}
	mctx, mcancel := context.WithCancel(context.WithoutCancel(r.ctx))
	defer mcancel()
	stop := context.AfterFunc(hctx, mcancel)
	defer stop()
	msg.SetContext(mctx)

	if !r.hand() {
		<-hctx.Done()
		return hctx.Err()
	}
	defer r.settled()
	select {
	case r.out <- msg:
	case <-r.stopping:
		<-hctx.Done()
		return hctx.Err()
	case <-hctx.Done():
		return hctx.Err()
	}
	select {
	case <-msg.Acked():
		return nil
	case <-msg.Nacked():
		return ErrNacked
	case <-hctx.Done():
		return hctx.Err()
	}
}
