package postgres

// This file: the typed constructors. They return the portable types over
// the unexported drivers, as gocloud's gcppubsub.OpenTopic returns a
// *pubsub.Topic, so an application never calls a driver method and skips
// the portable layer; and the Outbox, PostgreSQL's transactional publish.

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keyorder/keyorder"
	"github.com/keyorder/keyorder/internal/driverkit"
	"github.com/keyorder/keyorder/publish"
	"github.com/keyorder/keyorder/subscribe"
)

// OpenTopic returns a Publisher on topic, on pool. With opts.Migrate it
// first applies pending migrations; with opts.Create it creates the topic if
// missing, else a missing topic fails with keyorder.ErrNotFound. The pool
// stays the caller's: closing the Publisher does not close it. cfg
// configures the Publisher (nil: defaults).
func OpenTopic(ctx context.Context, pool *pgxpool.Pool, topic string, opts *Options, cfg *publish.Config) (*publish.Publisher, error) {
	return driverkit.Portable(publish.New, cfg)(openTopic(ctx, pool, topic, opts))
}

// OpenSubscription returns a Subscriber of subscription sub of topic, on
// pool. With opts.Migrate it first applies pending migrations; with
// opts.Create it creates the topic and subscription (with opts.Subscription)
// if missing, else a missing one fails with keyorder.ErrNotFound. The pool
// stays the caller's: closing the Subscriber does not close it. A
// subscription holds one extra connection outside the pool for LISTEN. cfg
// configures the Subscriber (nil: defaults).
func OpenSubscription(ctx context.Context, pool *pgxpool.Pool, topic, sub string, opts *Options, cfg *subscribe.Config) (*subscribe.Subscriber, error) {
	return driverkit.Portable(subscribe.New, cfg)(openSubscription(ctx, pool, topic, sub, opts))
}

// Outbox publishes to a topic inside the application's own transactions
// (the outbox pattern): a message becomes visible to consumers exactly when
// the transaction that published it commits, and vanishes if it rolls back.
// It validates messages exactly as a publish.Publisher does.
type Outbox struct {
	t *pgTopic
}

// OpenOutbox returns an Outbox on topic, on pool, opened as OpenTopic opens
// a topic (opts.Migrate, opts.Create). opts.MissingKey says what PublishTx
// does with a message that has no key. The pool stays the caller's.
func OpenOutbox(ctx context.Context, pool *pgxpool.Pool, topic string, opts *Options) (*Outbox, error) {
	t, err := openTopic(ctx, pool, topic, opts)
	if err != nil {
		return nil, err
	}
	return &Outbox{t: t}, nil
}

// PublishTx enqueues ms inside tx: they become visible to consumers exactly
// when tx commits, and vanish if it rolls back. Messages are validated
// exactly as publish.Publisher validates them: an empty ID gets a UUIDv7 (set
// on the message); an empty Key is taken from the keyorder.HeaderPartitionKey
// header; a message with neither is rejected with keyorder.ErrMissingKey
// unless Options.MissingKey is policy.Unordered; a message over a limit
// fails with a *keyorder.LimitError. Nothing is inserted unless every
// message is valid.
//
// Until tx ends, the heads of the keys it published are locked: consumers
// skip those keys and acknowledgements of them wait. Keep such transactions
// short. After Close, PublishTx returns keyorder.ErrClosed.
func (o *Outbox) PublishTx(ctx context.Context, tx pgx.Tx, ms ...*keyorder.Message) error {
	return o.t.PublishTx(ctx, tx, ms...)
}

// Limits returns the limits PublishTx checks.
func (o *Outbox) Limits() keyorder.Limits { return limits }

// Close releases the outbox (it stops its NOTIFY debouncer). Transactions
// already committed are not affected.
func (o *Outbox) Close() error { return o.t.Close() }
