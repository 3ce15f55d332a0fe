package postgres

import (
	"cmp"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/policy"
)

// Defaults for Options and SubscriptionOptions.
const (
	SchemaDefault         = "keyorder"
	LeaseDurationDefault  = 30 * time.Second
	MaxBatchDefault       = 100
	ChainLengthDefault    = 10
	PollIntervalDefault   = time.Second
	NotifyDebounceDefault = 5 * time.Millisecond
	VacuumIntervalDefault = 10 * time.Second
	// LeaseDurationMin is the shortest lease accepted.
	LeaseDurationMin = time.Second
)

// Options configure a Topic or Subscription opened on a pool. A nil *Options
// means the defaults. Every field has a URL query parameter of the same
// meaning (see the package documentation).
type Options struct {
	// Schema is the PostgreSQL schema holding keyorder's tables, so several
	// applications can share a database. Defaults to SchemaDefault.
	// URL: schema.
	Schema string
	// Migrate applies pending migrations when opening. Open never changes
	// the schema otherwise. URL: migrate=true.
	Migrate bool
	// Create creates the topic (and, when opening a subscription, the
	// subscription with Subscription's settings) if it does not exist.
	// Without it opening a missing one fails with keyorder.ErrNotFound.
	// URL: create=true.
	Create bool
	// Subscription holds the settings Create uses for a new subscription.
	// They are ignored for an existing one: a subscription's policy is fixed
	// when it is created. URL: ordering, max_attempts, min_backoff,
	// max_backoff, compact.
	Subscription *SubscriptionOptions
	// Lease is how long a claimed message (or chain) stays leased without
	// ExtendLeases (every backend's typed options call it Lease). At least
	// LeaseDurationMin. Defaults to LeaseDurationDefault. URL: lease.
	Lease time.Duration
	// LeaseDuration is the older name of Lease, read when Lease is not set (Lease
	// wins when both are).
	//
	// Deprecated: use Lease.
	LeaseDuration time.Duration
	// MaxBatch is the most messages one Receive returns. Defaults to
	// MaxBatchDefault. URL: max_batch.
	MaxBatch int
	// ChainLength is the most consecutive messages of one key a claim
	// takes (Exclusive and Ordered). Defaults to ChainLengthDefault; 1
	// disables chains. URL: chain.
	ChainLength int
	// PollInterval is the longest a waiting Receive sleeps between claims
	// when no notification arrives (the fallback if notifications are
	// lost). Defaults to PollIntervalDefault. URL: poll.
	PollInterval time.Duration
	// NotifyDebounce is the shortest interval between two notifications a
	// Topic sends; publishes inside the interval are announced by one
	// trailing notification. Defaults to NotifyDebounceDefault; negative
	// disables notifications (subscribers then poll). URL: notify_debounce.
	NotifyDebounce time.Duration
	// VacuumInterval is how often a Subscription vacuums the heads table,
	// which every claim and release updates: autovacuum visits a table at
	// most once per autovacuum_naptime (a minute by default), long enough
	// for a busy queue to pile up dead head versions that every claim scans.
	// Only one process vacuums at a time (an advisory lock decides); a
	// failure (e.g. a role that does not own the table) is logged once.
	// Defaults to VacuumIntervalDefault; negative disables. URL:
	// vacuum_interval.
	VacuumInterval time.Duration
	// MissingKey is what PublishTx does with a message that has no key:
	// Reject (the default) or Unordered. SendBatch leaves that decision to
	// the portable publisher. URL: missing_key.
	MissingKey policy.MissingKey
	// Logger receives the driver's diagnostics (listener reconnects).
	// Defaults to slog.Default().
	Logger *slog.Logger
}

// SubscriptionOptions are the settings of a subscription, fixed when it is
// created. A nil *SubscriptionOptions means the defaults.
type SubscriptionOptions struct {
	// Ordering is the subscription's delivery policy. Defaults to
	// policy.Ordered (the zero value), as on every backend and in URLs
	// (URL: ordering).
	Ordering policy.Ordering
	// MaxAttempts, MinBackoff and MaxBackoff are the retry settings kept
	// with the subscription; every consumer runs them (the driver reports
	// them in driver.Capabilities.Retry and they override the consumer's
	// subscribe.Config.Retry). A zero value is stored as zero and means the
	// subscription does not say: the consumer's Config.Retry, then the
	// policy package's default, decides. (Subscriptions created before this
	// rule stored the defaults 10, 100ms and 1m explicitly; those now run as
	// stated.)
	MaxAttempts int
	MinBackoff  time.Duration
	MaxBackoff  time.Duration
	// Compaction makes the subscription deliver, for each key, only the
	// newest message waiting when the key is claimed; the older waiting ones
	// are superseded: deleted, counted (BackendStats.Superseded), never
	// dead-lettered. For handlers that apply a key's latest state rather
	// than every change. A message in flight is never superseded; one
	// waiting for its retry (or a not-before time) is, by a newer ready one.
	// Exclusive: one message of a key at a time, the newest ready one.
	// Parallel: a message is delivered only if no newer one of its key is
	// ready or in flight, and a failed one is superseded instead of retried
	// when a newer one of its key is pending. Ordered refuses it (its
	// guarantee is the key's whole history): Create fails with
	// keyorder.ErrInvalidConfig. URL: compact=true.
	Compaction bool
}

// WithDefaults returns a copy of o with zero fields set to their defaults.
func (o *Options) WithDefaults() *Options {
	if o == nil {
		o = &Options{}
	}
	c := *o
	c.Schema = cmp.Or(c.Schema, SchemaDefault)
	c.LeaseDuration = cmp.Or(c.Lease, c.LeaseDuration, LeaseDurationDefault) // Lease wins over its older name
	c.Lease = c.LeaseDuration
	c.MaxBatch = cmp.Or(c.MaxBatch, MaxBatchDefault)
	c.ChainLength = cmp.Or(c.ChainLength, ChainLengthDefault)
	c.PollInterval = cmp.Or(c.PollInterval, PollIntervalDefault)
	c.NotifyDebounce = cmp.Or(c.NotifyDebounce, NotifyDebounceDefault)
	c.VacuumInterval = cmp.Or(c.VacuumInterval, VacuumIntervalDefault)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Subscription = c.Subscription.WithDefaults()
	return &c
}

var schemaRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// validate reports a field out of range; call it on WithDefaults' result.
func (o *Options) validate() error {
	switch {
	case !schemaRE.MatchString(o.Schema):
		return fmt.Errorf("%w: postgres: Options.Schema %q must be a lower-case SQL identifier", keyorder.ErrInvalidConfig, o.Schema)
	case o.LeaseDuration < LeaseDurationMin:
		return fmt.Errorf("%w: postgres: Options.Lease %v is below %v", keyorder.ErrInvalidConfig, o.LeaseDuration, LeaseDurationMin)
	case o.MaxBatch < 1 || o.MaxBatch > 10000:
		return fmt.Errorf("%w: postgres: Options.MaxBatch %d must be in [1, 10000]", keyorder.ErrInvalidConfig, o.MaxBatch)
	case o.ChainLength < 1 || o.ChainLength > 1000:
		return fmt.Errorf("%w: postgres: Options.ChainLength %d must be in [1, 1000]", keyorder.ErrInvalidConfig, o.ChainLength)
	case o.PollInterval < time.Millisecond:
		return fmt.Errorf("%w: postgres: Options.PollInterval %v is below 1ms", keyorder.ErrInvalidConfig, o.PollInterval)
	case !o.MissingKey.Valid():
		return fmt.Errorf("%w: postgres: Options.MissingKey: unknown missing-key policy %d", keyorder.ErrInvalidConfig, int(o.MissingKey))
	}
	return o.Subscription.validate()
}

// WithDefaults returns a copy of s (the zero options for nil). The retry
// fields keep their zero values: zero is what the subscription stores for
// "not said" (see MaxAttempts).
func (s *SubscriptionOptions) WithDefaults() *SubscriptionOptions {
	if s == nil {
		return &SubscriptionOptions{}
	}
	c := *s
	return &c
}

// conflicts reports whether an existing subscription's settings (s)
// disagree with those asked for: another ordering, or a retry setting
// asked for (non-zero) that differs from the stored one.
func (s *SubscriptionOptions) conflicts(asked *SubscriptionOptions) bool {
	differs := func(stored, want int64) bool { return want != 0 && want != stored }
	return s.Ordering != asked.Ordering || s.Compaction != asked.Compaction ||
		differs(int64(s.MaxAttempts), int64(asked.MaxAttempts)) ||
		differs(int64(s.MinBackoff), int64(asked.MinBackoff)) ||
		differs(int64(s.MaxBackoff), int64(asked.MaxBackoff))
}

func (s *SubscriptionOptions) validate() error {
	if !s.Ordering.Valid() {
		return fmt.Errorf("%w: postgres: SubscriptionOptions.Ordering %v", keyorder.ErrInvalidConfig, s.Ordering)
	}
	if s.Compaction && s.Ordering == policy.Ordered {
		return fmt.Errorf("%w: postgres: SubscriptionOptions.Compaction is not allowed with Ordering Ordered "+
			"(Ordered delivers every message of a key in order; compaction skips superseded ones): use Exclusive or Parallel",
			keyorder.ErrInvalidConfig)
	}
	if err := (policy.Retry{MaxAttempts: s.MaxAttempts, MinBackoff: s.MinBackoff, MaxBackoff: s.MaxBackoff}).Validate(); err != nil {
		return fmt.Errorf("%w: postgres: %v", keyorder.ErrInvalidConfig, err)
	}
	return nil
}

// Retry returns the subscription's retry settings as a policy.Retry; zero
// fields are those the subscription does not say.
func (s *SubscriptionOptions) Retry() policy.Retry {
	return policy.Retry{MaxAttempts: s.MaxAttempts, MinBackoff: s.MinBackoff, MaxBackoff: s.MaxBackoff}
}
