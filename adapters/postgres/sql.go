package postgres

// The queries, with {{schema}} replaced by the quoted schema name when a
// Topic or Subscription is opened. The comments say why each is correct under
// concurrency; the package documentation gives the overview.

// sqlLockHeads creates or locks the head row of every (keyed subscription,
// key) a publish touches, in (subscription, key) order so that concurrent
// publishers cannot deadlock. It runs before the messages are inserted, so
// publishers of one key draw message ids one transaction after the other:
// per key, id order is commit order, and no consumer can see a later id of a
// key without the earlier ones (trap 2).
//
// A new head becomes claimable at the key's first message's ready time
// (Ordered) or the earliest ready time (Exclusive). An existing head keeps its
// claimable_at under Ordered (the message at the head decides it) and while it
// is leased (claimable_at is then the lease expiry); an idle Exclusive head
// takes the earlier of the two. ON CONFLICT ... WHERE locks every conflicting
// head but writes only the ones that change, so publishing to a busy key
// does not rewrite its head each time.
const sqlLockHeads = `
INSERT INTO {{schema}}.heads AS h (sub_id, msg_key, ordered, claimable_at)
SELECT s.id, k.key, s.ordering = 2,
       CASE WHEN s.ordering = 2 THEN coalesce(k.first_ready, now()) ELSE coalesce(k.min_ready, now()) END
FROM {{schema}}.subscriptions s,
     unnest($2::text[], $3::timestamptz[], $4::timestamptz[]) AS k(key, first_ready, min_ready)
WHERE s.topic_id = $1 AND s.ordering > 0 AND ($5::integer IS NULL OR s.id = $5)
ORDER BY s.id, k.key
ON CONFLICT (sub_id, msg_key) DO UPDATE SET claimable_at = excluded.claimable_at
    WHERE NOT h.ordered AND h.lease_token IS NULL AND excluded.claimable_at < h.claimable_at`

// sqlInsert inserts the messages in the caller's order (ids follow it) and
// one delivery per subscription of the topic ($7 restricts it to one
// subscription, for redrive).
const sqlInsert = `
WITH m AS (
    INSERT INTO {{schema}}.messages (topic_id, msg_id, msg_key, payload, headers, not_before, published_at)
    SELECT $1, u.msg_id, nullif(u.msg_key, ''), u.payload, u.headers::jsonb, u.not_before, coalesce(u.published_at, now())
    FROM unnest($2::text[], $3::text[], $4::bytea[], $5::text[], $6::timestamptz[], $8::timestamptz[])
         WITH ORDINALITY AS u(msg_id, msg_key, payload, headers, not_before, published_at, ord)
    ORDER BY u.ord
    RETURNING id, msg_key, not_before
)
INSERT INTO {{schema}}.deliveries (sub_id, id, msg_key, direct, can_run_after)
SELECT s.id, m.id, m.msg_key, s.ordering = 0 OR m.msg_key IS NULL, coalesce(m.not_before, now())
FROM m CROSS JOIN {{schema}}.subscriptions s
WHERE s.topic_id = $1 AND ($7::integer IS NULL OR s.id = $7)`

// sqlClaimKeys claims chains of keys through the claim_keys function (see
// migration/001_init.up.sql for why it is correct under concurrency, and
// 004_started.up.sql for which members of an expired chain a lost lease
// counts against).
const sqlClaimKeys = `SELECT * FROM {{schema}}.claim_keys($1, $2, $3, $4::interval, $5, $6)`

// sqlClaimDirect claims deliveries one by one (Parallel subscriptions, and
// keyless messages on keyed subscriptions): the row's own can_run_after
// becomes its lease expiry.
const sqlClaimDirect = `
WITH c AS (
    SELECT id FROM {{schema}}.deliveries
    WHERE sub_id = $1 AND direct AND can_run_after <= now()
    ORDER BY can_run_after, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), du AS (
    UPDATE {{schema}}.deliveries d SET attempts = d.attempts + 1, can_run_after = now() + $3::interval, lease_token = $4
    FROM c WHERE d.sub_id = $1 AND d.id = c.id
    RETURNING d.id, d.attempts
)
SELECT m.id, m.msg_id, m.msg_key, m.payload, m.headers, m.not_before, m.published_at, du.attempts
FROM du JOIN {{schema}}.messages m ON m.id = du.id
ORDER BY m.id`

// sqlNextWake returns the seconds until something of the subscription may
// become claimable (negative: now; NULL: nothing pending).
const sqlNextWake = `
SELECT extract(epoch FROM least(
    (SELECT min(claimable_at) FROM {{schema}}.heads WHERE sub_id = $1),
    (SELECT min(can_run_after) FROM {{schema}}.deliveries WHERE sub_id = $1 AND direct)) - now())::float8`

// Releasing the heads of settled chains takes three statements in one
// transaction. sqlLockRelease locks the heads first (in key order, like the
// publishers); only then does sqlRelease read the deliveries, in a new
// statement whose snapshot includes every publisher that held a head lock
// before us, while later publishers wait for our commit. A head left with
// nothing pending is deleted; a publisher waiting on it then inserts a fresh
// one. So a publish that commits while the key's last message is acked
// always leaves the key with a claimable head (trap 1). The lease token
// condition keeps a consumer whose lease was lost from releasing the chain of
// the consumer that reclaimed the key.
//
// Like the ack's ids (see sqlAck), the keys of these statements and of
// sqlExtendKeys and sqlStarted, and the ids of sqlReleaseDirect and
// sqlExtendDirect, also go through ARRAY(SELECT unnest(...)), so that the
// heads and deliveries are looked up in their primary key. Planned with
// the 1,000 keys or ids themselves, or with a generic plan, they read every
// head (or delivery) of the subscription, by a scan or through its sub_id
// range of an index, to hash it and join it with the array, with or
// without statistics (TestArrayPlansLookUpKeys). The join with unnest
// stays: it pairs each key or id with its token.
const sqlLockRelease = `
SELECT 1 FROM {{schema}}.heads WHERE sub_id = $1 AND msg_key = ANY(ARRAY(SELECT unnest($2::text[])))
ORDER BY msg_key FOR UPDATE`

const sqlRelease = `
UPDATE {{schema}}.heads h SET lease_token = NULL, chain_end = NULL, (claimable_at, from_id) = ({{next}})
FROM unnest($2::text[], $3::bigint[]) AS r(key, token)
WHERE h.sub_id = $1 AND h.msg_key = ANY(ARRAY(SELECT unnest($2::text[])))
  AND h.msg_key = r.key AND h.lease_token = r.token`

// nextOrdered: the head message decides when an Ordered key is claimable
// ('infinity' when nothing is pending; the head is then dropped).
const nextOrdered = `SELECT coalesce(min(x.can_run_after), 'infinity'), coalesce(min(x.id), h.from_id) FROM (
    SELECT d.can_run_after, d.id FROM {{schema}}.deliveries d
    WHERE d.sub_id = h.sub_id AND d.msg_key = h.msg_key AND NOT d.direct AND d.id >= h.from_id
    ORDER BY d.id LIMIT 1) x`

// nextExclusive: the earliest ready message decides for an Exclusive key.
const nextExclusive = `SELECT coalesce(min(d.can_run_after), 'infinity'), coalesce(min(d.id), h.from_id)
    FROM {{schema}}.deliveries d
    WHERE d.sub_id = h.sub_id AND d.msg_key = h.msg_key AND NOT d.direct AND d.id >= h.from_id`

const sqlDropIdleHeads = `
DELETE FROM {{schema}}.heads
WHERE sub_id = $1 AND msg_key = ANY($2::text[]) AND lease_token IS NULL AND claimable_at = 'infinity'`

// sqlAckKeyed deletes settled keyed deliveries and the message bodies no
// other subscription of the topic still needs (dead letters keep their own
// copy), guarded by the leases they were claimed under: $2, $4 and $5 are
// the deliveries' ids, keys and lease tokens, $3 the topic (sqlAck does the
// same for direct deliveries; one call queues both as needed). A keyed
// delivery is deleted only while its key's head still carries the token of
// the claim that delivered it, and the head is locked FOR KEY SHARE until the
// statement's transaction ends, as sqlComplete does: a claim taking the key
// over (FOR UPDATE SKIP LOCKED) either committed first, and the token no
// longer matches, or waits for this transaction and then finds the
// delivery gone. A direct delivery is deleted only while it carries its own
// token (a claim rewrites it; the DELETE waits for a claim in progress and
// checks the token again). So a consumer whose lease was lost never deletes
// a delivery another consumer has claimed and may be running. It returns
// the ids of the deliveries that failed the guard (their leases were lost).
// The other subscriptions are looked up once per statement, not per row.
// Two subscriptions acking one message at the same instant may each still
// see the other's delivery and both keep the body; Admin.Purge collects
// those.
//
// The ids go through ARRAY(SELECT unnest(...)), which the planner cannot
// see into: it plans for a few ids and looks each one up in the primary
// key, then each body in messages_pkey. Given the array itself (a custom
// plan, which PostgreSQL uses for a statement's first executions and an
// unnamed statement's every one) it weighs a thousand lookups against
// scanning the subscription's deliveries and picked the scan — every
// delivery of the subscription read per ack — and, with fresh statistics,
// a nested loop of every message against the acked rows: 10 s for 1,000
// ids over 100,000 messages instead of 3 ms (TestArrayPlansLookUpKeys).
const sqlAckKeyed = `
WITH lk AS (
    SELECT h.msg_key, h.lease_token FROM {{schema}}.heads h
    JOIN unnest($4::text[], $5::bigint[]) AS r(key, token)
      ON h.sub_id = $1 AND h.msg_key = ANY(ARRAY(SELECT unnest($4::text[])))
     AND h.msg_key = r.key AND h.lease_token = r.token
    ORDER BY h.msg_key
    FOR KEY SHARE OF h
), d AS (
    DELETE FROM {{schema}}.deliveries d
    USING unnest($2::bigint[], $4::text[], $5::bigint[]) AS r(id, key, token)
    WHERE d.sub_id = $1 AND d.id = ANY(ARRAY(SELECT unnest($2::bigint[]))) AND d.id = r.id
      AND (r.key, r.token) IN (SELECT lk.msg_key, lk.lease_token FROM lk)
    RETURNING d.id
)` + ackBodies + `
SELECT r.id FROM unnest($2::bigint[], $4::text[], $5::bigint[]) AS r(id, key, token)
WHERE (r.key, r.token) NOT IN (SELECT lk.msg_key, lk.lease_token FROM lk)`

// sqlAck is the acknowledgement of direct deliveries (sqlAckKeyed's
// counterpart): $2 and $4 are their ids and lease tokens.
const sqlAck = `
WITH d AS (
    DELETE FROM {{schema}}.deliveries d
    USING unnest($2::bigint[], $4::bigint[]) AS r(id, token)
    WHERE d.sub_id = $1 AND d.id = ANY(ARRAY(SELECT unnest($2::bigint[]))) AND d.id = r.id AND d.lease_token = r.token
    RETURNING d.id
)` + ackBodies + `
SELECT r.id FROM unnest($2::bigint[]) AS r(id) WHERE r.id NOT IN (SELECT d.id FROM d)`

// ackBodies deletes the bodies of the acknowledged deliveries (d) that no
// other subscription of topic $3 still holds.
const ackBodies = `, bodies AS (
    DELETE FROM {{schema}}.messages m USING d WHERE m.id = d.id
    AND NOT EXISTS (SELECT 1 FROM {{schema}}.deliveries o
        WHERE o.sub_id = ANY (ARRAY(SELECT id FROM {{schema}}.subscriptions WHERE topic_id = $3 AND id <> $1))
          AND o.id = m.id)
)`

// sqlNack makes a delivery claimable again after the delay. A keyed
// delivery's key stays held by its head until the chain is released, and
// then (Ordered) by this can_run_after. Either is only touched while the
// lease is still ours: a consumer whose lease was lost does not delay the
// consumer that took the message over. The delivery keeps the lease token it
// failed under: if that lease is lost later, the claim taking the key over
// knows this attempt is already written (see migration 002).
const sqlNackKeyed = `
UPDATE {{schema}}.deliveries d SET can_run_after = now() + $3::interval, attempts = $4, lease_token = $5
WHERE d.sub_id = $1 AND d.id = $2
  AND EXISTS (SELECT 1 FROM {{schema}}.heads h WHERE h.sub_id = $1 AND h.msg_key = d.msg_key AND h.lease_token = $5)`

const sqlNackDirect = `
UPDATE {{schema}}.deliveries SET can_run_after = now() + $3::interval, lease_token = NULL
WHERE sub_id = $1 AND id = $2 AND lease_token = $4`

// sqlSetAttemptsDirect writes the attempts a direct delivery used, while
// its lease is ours (Return; the claim counts the next one).
const sqlSetAttemptsDirect = `
UPDATE {{schema}}.deliveries SET attempts = $3
WHERE sub_id = $1 AND id = $2 AND lease_token = $4`

// sqlReleaseDirect gives back a direct claim without counting it. (A keyed
// claim is given back by releasing its chain: claims write no attempt.)
const sqlReleaseDirect = `
UPDATE {{schema}}.deliveries d SET attempts = greatest(d.attempts - 1, 0), can_run_after = now(), lease_token = NULL
FROM unnest($2::bigint[], $3::bigint[]) AS r(id, token)
WHERE d.sub_id = $1 AND d.id = ANY(ARRAY(SELECT unnest($2::bigint[])))
  AND d.id = r.id AND d.lease_token = r.token`

const sqlExtendKeys = `
UPDATE {{schema}}.heads h SET claimable_at = now() + $4::interval
FROM unnest($2::text[], $3::bigint[]) AS r(key, token)
WHERE h.sub_id = $1 AND h.msg_key = ANY(ARRAY(SELECT unnest($2::text[])))
  AND h.msg_key = r.key AND h.lease_token = r.token
RETURNING h.msg_key, h.lease_token`

const sqlExtendDirect = `
UPDATE {{schema}}.deliveries d SET can_run_after = now() + $4::interval
FROM unnest($2::bigint[], $3::bigint[]) AS r(id, token)
WHERE d.sub_id = $1 AND d.id = ANY(ARRAY(SELECT unnest($2::bigint[])))
  AND d.id = r.id AND d.lease_token = r.token
RETURNING d.id`

// sqlDeadLetter moves a delivery to the dead letters, guarded by its
// lease as sqlAck is ($5..$7: its key, lease token and direct flag). It
// returns whether the delivery passed the guard.
const sqlDeadLetter = `
WITH lk AS (
    SELECT 1 FROM {{schema}}.heads h
    WHERE h.sub_id = $1 AND h.msg_key = $5::text AND h.lease_token = $6::bigint AND NOT $7::boolean
    FOR KEY SHARE OF h
), d AS (
    DELETE FROM {{schema}}.deliveries d
    WHERE d.sub_id = $1 AND d.id = $2
      AND CASE WHEN $7::boolean THEN d.lease_token = $6::bigint ELSE EXISTS (SELECT 1 FROM lk) END
    RETURNING id
), ins AS (
    INSERT INTO {{schema}}.dead_letters (sub_id, id, msg_id, msg_key, payload, headers, published_at, reason, attempts)
    SELECT $1, m.id, m.msg_id, m.msg_key, m.payload, m.headers, m.published_at, $3, $4
    FROM d JOIN {{schema}}.messages m ON m.id = d.id
    ON CONFLICT (sub_id, id) DO NOTHING
)
SELECT CASE WHEN $7::boolean THEN EXISTS (SELECT 1 FROM d) ELSE EXISTS (SELECT 1 FROM lk) END`

// sqlStarted records the highest id of each leased chain whose handler
// started (migration 004). It locks the heads in key order first, as
// publishers and releases do, so it never deadlocks with them; a chain whose
// lease is no longer ours matches nothing and is not locked. The keys are
// looked up as in sqlRelease.
const sqlStarted = `
WITH l AS (
    SELECT h.ctid AS row_id, r.id FROM {{schema}}.heads h
    JOIN unnest($2::text[], $3::bigint[], $4::bigint[]) AS r(key, token, id)
      ON h.sub_id = $1 AND h.msg_key = ANY(ARRAY(SELECT unnest($2::text[])))
     AND h.msg_key = r.key AND h.lease_token = r.token
    ORDER BY h.msg_key
    FOR UPDATE OF h
)
UPDATE {{schema}}.heads h SET started_end = greatest(h.started_end, l.id)
FROM l WHERE h.ctid = l.row_id`

// sqlComplete settles deliveries inside the application's transaction
// (CompleteTx), guarded by their leases: $2..$5 are the ids, keys, lease
// tokens and direct flags. A keyed delivery is completed only while its
// key's head still carries the token of the claim that delivered it, and
// the head is locked FOR KEY SHARE until the transaction ends: claims lock
// heads FOR UPDATE SKIP LOCKED, so no consumer can take the key over (even
// once the lease has expired) before the transaction ends, and after a
// commit the deliveries are gone for the claim's fresh snapshot. A
// publisher's head update (FOR NO KEY UPDATE) does not conflict with KEY
// SHARE, so a PublishTx in the same or another transaction does not wait
// on it. A direct delivery is locked FOR UPDATE with its own token, which
// direct claims skip likewise. It returns how many members passed the
// guard and how many deliveries it deleted; a member that failed the
// guard deletes nothing, and the caller refuses the whole completion.
const sqlComplete = `
WITH r AS (
    SELECT * FROM unnest($2::bigint[], $3::text[], $4::bigint[], $5::boolean[]) AS r(id, key, token, direct)
), lk AS (
    SELECT h.msg_key, h.lease_token FROM {{schema}}.heads h
    WHERE h.sub_id = $1 AND h.msg_key = ANY(ARRAY(SELECT r.key FROM r WHERE NOT r.direct))
      AND (h.msg_key, h.lease_token) IN (SELECT r.key, r.token FROM r WHERE NOT r.direct)
    ORDER BY h.msg_key
    FOR KEY SHARE OF h
), ld AS (
    SELECT d.id FROM {{schema}}.deliveries d
    WHERE d.sub_id = $1 AND d.id = ANY(ARRAY(SELECT r.id FROM r WHERE r.direct))
      AND (d.id, d.lease_token) IN (SELECT r.id, r.token FROM r WHERE r.direct)
    ORDER BY d.id
    FOR UPDATE OF d
), ok AS (
    SELECT r.id FROM r
    WHERE (NOT r.direct AND (r.key, r.token) IN (SELECT lk.msg_key, lk.lease_token FROM lk))
       OR (r.direct AND r.id IN (SELECT ld.id FROM ld))
), del AS (
    DELETE FROM {{schema}}.deliveries d
    WHERE d.sub_id = $1 AND d.id = ANY(ARRAY(SELECT ok.id FROM ok))
      AND (SELECT count(*) FROM ok) = cardinality($2::bigint[])
    RETURNING d.id
), bodies AS (
    DELETE FROM {{schema}}.messages m USING del WHERE m.id = del.id
    AND NOT EXISTS (SELECT 1 FROM {{schema}}.deliveries x
        WHERE x.sub_id = ANY (ARRAY(SELECT s.id FROM {{schema}}.subscriptions s WHERE s.topic_id = $6 AND s.id <> $1))
          AND x.id = m.id)
)
SELECT (SELECT count(*) FROM ok), (SELECT count(*) FROM del)`
