// Package postgres is keyorder's native PostgreSQL queue: topics,
// subscriptions (consumer groups) with their own policy and progress, and
// the three delivery policies enforced by the claim query itself, correct
// with any number of competing consumer processes. It is for teams that want
// ordered messaging with nothing but the database they already run, and it
// lets a message be enqueued in the same transaction as the business change
// that causes it (the outbox pattern, PublishTx).
//
// The schema is created by Migrate (embedded, versioned migrations under
// migration/, applied in one transaction under an advisory lock, recorded in
// <schema>.schema_migrations), never implicitly: Open migrates only when
// Options.Migrate is set. Options.Schema keeps several applications apart in
// one database.
//
// # URLs
//
// Importing the package registers postgres:// and postgresql:// on
// driver.DefaultMux:
//
//	postgres://user:pass@host:5432/db?topic=ledger&subscription=apply-balance&schema=keyorder
//
// Each keyorder parameter sets one Options field: topic, subscription,
// schema, migrate, create (with ordering, max_attempts, min_backoff,
// max_backoff, compact for a new subscription), lease, max_batch, chain, poll,
// notify_debounce, vacuum_interval, missing_key. A subscription a URL creates
// is Ordered unless the URL says ordering=parallel or ordering=exclusive, as
// on every backend's URL (the typed SubscriptionOptions' zero Ordering is
// Ordered too). Until this default was introduced a URL without ordering
// created a Parallel subscription; opening such a subscription with
// create=true and no ordering now fails with keyorder.ErrInvalidConfig (its
// ordering differs from the one asked for): add ordering=parallel. The
// parameter names are the same on every backend for the same concept
// (ordering, lease, max_batch, max_attempts, chain). The connection parameters sslmode,
// sslrootcert, sslcert, sslkey, sslpassword, connect_timeout,
// application_name, target_session_attrs and pool_* go to pgx; any other
// parameter is rejected with keyorder.ErrBadURL (a password goes in the
// userinfo, never in ?password=; errors show it redacted). A topic or
// subscription opened from a URL owns its pool; the typed constructors
// (OpenTopic, OpenSubscription, OpenOutbox, NewAdmin) take the
// application's *pgxpool.Pool. OpenTopic and OpenSubscription return the
// portable *publish.Publisher and *subscribe.Subscriber; the drivers are
// not exported. PostgreSQL's own operations are on Admin (topics,
// subscriptions, retention) and Outbox (PublishTx); dead letters, held keys
// and counts are the Subscriber's (DeadLetters, Redrive, HeldKeys, Stats).
//
// # Ordering
//
// A message is stored once (messages) and fans out to one delivery row per
// subscription of its topic (deliveries); a subscription created later sees
// only what is published after it. Exclusive and Ordered subscriptions keep
// one head row per key with something pending (heads). A head's
// claimable_at says when the key can next be claimed: under Ordered the
// retry or not-before time of the key's oldest message, under Exclusive the
// earliest of its messages, and while a consumer holds the key, the lease
// expiry — so an expired lease makes the key claimable again with no
// further bookkeeping.
//
// A claim (the claim_keys function) locks claimable heads with FOR UPDATE
// SKIP LOCKED and, for each, takes a chain of up to Options.ChainLength
// consecutive messages of the key, recording the lease in the same
// transaction: two consumers never hold one key, and no key is ever claimed
// but not yet recorded. Under Ordered the chain stops before the first
// message that is not ready, so nothing overtakes a message waiting for its
// retry or its not-before time; under Exclusive a waiting message is
// overtaken. The chain is read by a second statement, after the locks are
// held, so it never includes what the previous holder acknowledged while the
// claim waited. Parallel subscriptions, and keyless messages on keyed
// subscriptions, are claimed row by row with no key constraint.
//
// Two races are closed by locking order rather than by luck:
//
//   - Publishers lock (or create) the heads of the keys they publish before
//     they draw message ids, so concurrent publishers of one key commit one
//     after the other in id order, and no consumer can see a later id of a
//     key without the earlier ones. (PublishTx holds those locks until the
//     caller's transaction ends: keep it short.)
//   - Releasing a key after its chain is settled locks the head first and
//     only then reads the key's remaining messages in a new statement: a
//     publish that commits while the key's last message is acknowledged is
//     either seen, or waits and then finds (or recreates) the head. A key is
//     never left with messages but no head.
//
// A chain's key is released only after every member's acknowledgement,
// Nack, Release or dead letter has committed.
//
// # Delivery semantics
//
// Delivery is at least once. Receive returns chains of one key in order;
// Ack deletes the deliveries (and the message bodies no other subscription
// needs; Admin.Purge collects the rest); Nack(m, d) records the failed
// attempt and holds the key (Ordered) until d has passed; Release gives
// messages back without counting an attempt; DeadLetter moves a message to
// dead_letters with its reason and attempts and lets its key continue;
// Redrive puts dead letters back after what arrived meanwhile with a fresh
// attempt count. A message's Attempt is 1 on its first claim and grows with
// every failure and with every lease that expired while it was running (a
// crashed consumer counts). Only messages whose handler started count
// (migration 004): the subscriber tells the driver as each handler starts
// (driver.StartRecorder), and the driver records, per leased chain, the
// highest member that started (heads.started_end). A chain that sat in its
// consumer's lanes waiting for a worker when the consumer died comes back
// with no attempt counted; of the members that started, those neither
// settled nor nacked under the lost lease count one each (the one running,
// and one whose Ack had not landed: it ran too).
//
// The record is written asynchronously, 100 ms after the start, batched over
// the chains that started meanwhile (one round trip, one head row update per
// chain), and only for chains whose started member is not settled by then:
// no handler waits for it, and handlers faster than that cost no write. It
// can be late: a run whose process dies before its record lands is not
// counted. That is bounded: the claim that takes over such a lease marks the
// chain's first unrecorded member that may have been running
// (deliveries.unstarted); the next claim returns it as suspect, and Started
// writes a suspect message's record before it returns, so from then on each
// of its runs counts however fast it kills its process: a message that kills
// every consumer runs at most once more than MaxAttempts allows. Should
// records keep failing, the third unrecorded loss of one message is counted
// anyway (so is, rarely, a message that really sat unstarted through three
// crashes). A driver used without subscribe must call Started for lost
// leases to count. Claimed messages of a Parallel subscription (or keyless
// ones), each leased on its own, are counted at claim whether or not they
// started.
//
// Drivers never retry: IsRetryable and ErrorCode classify errors (a lost
// connection, a restarting server, a deadlock or serialization failure are
// retryable) for the portable layer.
//
// Publishes send a NOTIFY on the topic's channel, at most one per
// Options.NotifyDebounce per Topic (NOTIFY serializes commits on a global
// lock); a waiting Receive wakes on it, on the next retry or delay falling
// due, or after Options.PollInterval, whichever is first. An
// acknowledgement or Nack that makes a key claimable again wakes the waiting
// Receive of its own process at once (no NOTIFY: other processes find the
// key on their next claim or poll). The listening connection reconnects with
// backoff when it is lost.
//
// # Compaction
//
// A subscription created with SubscriptionOptions.Compaction (URL:
// compact=true) delivers, for each key, only the newest message waiting when
// the key is claimed; the key's older waiting messages are superseded:
// deleted with their bodies (when no other subscription needs them) and
// counted in the superseded table (BackendStats.Superseded), never
// dead-lettered. It is for handlers that apply a key's latest state.
// Ordered refuses it with keyorder.ErrInvalidConfig (its guarantee is the
// key's history), and so does the schema (a CHECK constraint).
//
// Under Exclusive, claim_keys_compact (migration 003) locks claimable heads
// as claim_keys does, takes the newest ready message of each key (a chain of
// one) and deletes the older ones, ready or waiting for a retry or a
// not-before time, in the same transaction. A claimable head is not leased,
// so nothing superseded is in flight; a message in flight is never
// superseded, and newer ones wait for it. Because publishers lock the head
// before drawing ids, no message older than the claimed one can appear
// later: a key never sees an older message after a newer one, and the
// newest is never lost. Newer messages not yet due stay.
//
// Under Parallel, keyed messages are claimed row by row: a locked ready row
// is delivered only if no newer message of its key is ready or in flight
// (in the claim's snapshot), and is superseded otherwise; claiming a row
// supersedes the key's older rows that nobody holds (SKIP LOCKED: a row
// another claim holds is judged by that claim, which sees ours as newer).
// A failed message is superseded instead of retried when its key has a
// newer message pending. The key lookups use an index of the subscription's
// own (deliveries_compact_<id>, partial on its id, created with it and
// dropped by DeleteSubscription), so other subscriptions' publishes do not
// maintain it. Claims of one key run side by side, so two
// messages of a key can be delivered together, and a message that fails
// after a newer one of its key was acknowledged is retried: Parallel
// compaction saves work, it does not order.
//
// A consumer that loses its lease loses its message to compaction when a
// newer one is waiting (its late Ack or Nack changes nothing); with nothing
// newer the message is redelivered with the lost attempt counted.
//
// Redrive places a dead letter after what arrived meanwhile, as everywhere:
// on a compacting subscription it becomes its key's newest message and
// supersedes the newer updates still waiting. Redrive only what is still
// current.
//
// # Retry settings
//
// A subscription's retry settings (max_attempts, min_backoff, max_backoff)
// are stored with it, like its ordering, and are the ones every consumer
// runs: the driver reports them in driver.Capabilities.Retry and the
// subscribe package uses them over its Config.Retry, which fills only the
// settings the subscription leaves zero (not said). A consumer asking for a
// different value is overridden and the disagreement logged; reopening the
// subscription with Create and a different non-zero setting fails with
// keyorder.ErrInvalidConfig.
package postgres
