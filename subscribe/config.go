package subscribe

// This file: what a Subscriber is configured with, and the retry policy it
// settles on.

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/lanes"
	"github.com/keyorder/keyorder/policy"
)

// HandlerFunc handles one delivery; see the package documentation for what
// its result means.
type HandlerFunc func(ctx context.Context, d *keyorder.Delivery) error

// Middleware wraps a handler. Config.Middleware runs the first entry
// outermost.
type Middleware func(next HandlerFunc) HandlerFunc

// Defaults for Config.
const (
	WorkersDefault         = 8
	ShutdownTimeoutDefault = 30 * time.Second
	DedupeSizeDefault      = 10000
	MaxHeldDefault         = 10000
)

// Config configures a Subscriber. A nil *Config means all defaults.
type Config struct {
	// Workers is the number of lanes (Assign ByKey) or workers (Shared).
	// Defaults to WorkersDefault.
	Workers int
	// Assign decides how keys map onto workers. Defaults to lanes.Shared
	// (the zero value): any free worker runs the oldest message whose key
	// is free. lanes.ByKey binds each key to one of Workers lanes, which
	// passes more messages per second with handlers that take next to no
	// time and fewer with handlers that wait (see package lanes).
	Assign lanes.Assignment
	// Retry is the attempt budget and backoff. The retry policy is a
	// property of the subscription, like its ordering: where the backend
	// stores one with the subscription (keyorder.Capabilities.Retry;
	// PostgreSQL's max_attempts, min_backoff, max_backoff), the stored
	// settings run, and Retry fills only the fields the subscription leaves
	// zero. A Retry field that disagrees with the subscription is overridden
	// and the disagreement logged, so every consumer of a subscription
	// retries alike. NoJitter always comes from here. Fields still zero take
	// the policy package's defaults (MaxAttempts policy.MaxAttemptsDefault).
	Retry policy.Retry
	// MaxOutstanding bounds the messages received and not yet finished.
	// Messages waiting in process on a time (a retry, a not-before time or
	// a throttle) are not counted, nor, under Ordered where the process
	// holds groups, the messages of their key behind them: a held key must
	// not stop the others. MaxHeld bounds those. Defaults to 2×Workers.
	MaxOutstanding int
	// MaxHeld limits the messages held in process outside MaxOutstanding:
	// those waiting on a time and, where the process holds groups (no
	// native hold), those received behind them in their key. While that
	// many are held the subscriber stops receiving, which holds every key,
	// until some of them have run (a held key's backlog runs when its
	// head's time comes); see "Held keys" in the package documentation.
	// A process keeps at most MaxOutstanding+MaxHeld received messages.
	// Defaults to MaxHeldDefault.
	MaxHeld int
	// ShutdownTimeout is how long Run waits for running handlers after its
	// context ends. Defaults to ShutdownTimeoutDefault.
	ShutdownTimeout time.Duration
	// DedupeSize is how many acknowledged message IDs are remembered, at
	// least (up to twice as many), to suppress redeliveries. Defaults to
	// DedupeSizeDefault; negative disables. Over a backend whose
	// acknowledgements are final (PostgreSQL) only the IDs whose Ack
	// failed are remembered.
	DedupeSize int
	// Middleware wraps the handler, first entry outermost.
	Middleware []Middleware
	// Logger receives the subscriber's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Observer sees each handler attempt and its outcome, for tracing and
	// metrics (see module github.com/keyorder/keyorder/otelkeyorder). Nil
	// means none, and costs one nil check per attempt. Under RunBatch it
	// sees each message of a batch as an attempt of its own.
	Observer Observer
	// Batch configures the batches RunBatch hands its handler; Run ignores
	// it. Nil means the defaults of BatchConfig.
	Batch *BatchConfig

	// LaneKey refines the broker's ordering groups in process: a keyed
	// message's lane group is keyorder.JoinKey(its key, LaneKey's value),
	// or keyorder.JoinKey(its key) when the value is missing (a missing
	// part keeps the broker's group), so two messages share a lane group
	// only if they share the broker's group: broker key "a/b" unrefined is
	// lane "a%2Fb", never the lane "a/b" of broker key "a" refined by "b".
	// The lane group is internal: the Delivery, throttles and logs see the
	// broker's key. It can only refine, never merge, because the broker
	// orders and holds by its own key: messages of two broker groups may go
	// to two processes, where no lane could order them. A refinement lets
	// a broker group (a tenant, say) run its sub-groups (accounts)
	// concurrently on a broker that streams a key's messages (Pub/Sub,
	// Pulsar); on brokers that hold a group natively it adds little. Fixed
	// for a subscription's life (see keyorder.KeyFunc). Nil means the
	// broker's key.
	LaneKey keyorder.KeyFunc
	// FairnessKey returns a message's fairness key (FairnessKeyHeader reads
	// the portable header). With it, the lanes choose among fairness keys
	// round robin instead of by arrival alone (see lanes.Config.Fair and
	// the package documentation for what that can and cannot make fair).
	// Nil means no fair scheduling.
	FairnessKey MessageFunc
	// FairnessWeight, with FairnessKey, gives a fairness key's weight: the
	// messages it is served in a row in its turn. Nil means 1 for all.
	FairnessWeight func(fairKey string) int
	// Throttles are rate limits checked before each handler call; see
	// Throttle. Nil means none.
	Throttles []Throttle
}

// WithDefaults returns a copy of c with defaults applied.
func (c *Config) WithDefaults() *Config {
	out := &Config{}
	if c != nil {
		*out = *c
	}
	if out.Workers == 0 {
		out.Workers = WorkersDefault
	}
	out.Retry = out.Retry.WithDefaults()
	if out.MaxOutstanding == 0 {
		out.MaxOutstanding = 2 * out.Workers
	}
	if out.MaxHeld == 0 {
		out.MaxHeld = MaxHeldDefault
	}
	if out.ShutdownTimeout == 0 {
		out.ShutdownTimeout = ShutdownTimeoutDefault
	}
	if out.DedupeSize == 0 {
		out.DedupeSize = DedupeSizeDefault
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	out.Batch = out.Batch.WithDefaults()
	return out
}

func (c *Config) validate() error {
	switch {
	case c.Workers < 0:
		return fmt.Errorf("%w: subscribe.Config.Workers must be positive, got %d", keyorder.ErrInvalidConfig, c.Workers)
	case c.MaxOutstanding < 0:
		return fmt.Errorf("%w: subscribe.Config.MaxOutstanding must be positive, got %d", keyorder.ErrInvalidConfig, c.MaxOutstanding)
	case c.MaxHeld < 0:
		return fmt.Errorf("%w: subscribe.Config.MaxHeld must be positive, got %d", keyorder.ErrInvalidConfig, c.MaxHeld)
	case c.ShutdownTimeout < 0:
		return fmt.Errorf("%w: subscribe.Config.ShutdownTimeout must not be negative", keyorder.ErrInvalidConfig)
	case !c.Assign.Valid():
		return fmt.Errorf("%w: subscribe.Config.Assign: unknown assignment %d", keyorder.ErrInvalidConfig, int(c.Assign))
	}
	if err := c.Batch.validate(); err != nil {
		return err
	}
	if err := c.Retry.Validate(); err != nil {
		return fmt.Errorf("%w: subscribe.Config.Retry: %v", keyorder.ErrInvalidConfig, err)
	}
	if err := validateThrottles(c.Throttles); err != nil {
		return err
	}
	return nil
}

// subscriptionRetry returns the retry policy a subscriber runs: the
// subscription's stored settings, its zero fields filled from the
// consumer's, then the defaults. A consumer setting that disagrees with the
// subscription is logged and not used.
func subscriptionRetry(stored, asked policy.Retry, log *slog.Logger) policy.Retry {
	r := stored
	fill := func(name string, s *int64, a int64) {
		switch {
		case *s == 0:
			*s = a
		case a != 0 && a != *s:
			log.Warn("keyorder: subscribe.Config.Retry disagrees with the subscription's stored retry settings; the subscription's run",
				"field", name, "subscription", *s, "config", a)
		}
	}
	ma, mn, mx := int64(r.MaxAttempts), int64(r.MinBackoff), int64(r.MaxBackoff)
	fill("MaxAttempts", &ma, int64(asked.MaxAttempts))
	fill("MinBackoff", &mn, int64(asked.MinBackoff))
	fill("MaxBackoff", &mx, int64(asked.MaxBackoff))
	r = policy.Retry{MaxAttempts: int(ma), MinBackoff: time.Duration(mn), MaxBackoff: time.Duration(mx), NoJitter: asked.NoJitter}
	return r.WithDefaults()
}

// Retry returns the retry policy the subscriber runs (see Config.Retry).
func (s *Subscriber) Retry() policy.Retry { return s.cfg.Retry }
