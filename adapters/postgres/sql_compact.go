package postgres

import (
	"strconv"
	"strings"
)

// The queries of compacting subscriptions (SubscriptionOptions.Compaction,
// migration 003). Exclusive keys are claimed through claim_keys_compact
// (see migration/003_compaction.up.sql for why it is correct under
// concurrency); Parallel subscriptions, whose keyed messages are claimed row
// by row, through sqlClaimDirectCompact.

const sqlClaimKeysCompact = `SELECT * FROM {{schema}}.claim_keys_compact($1, $2, $3, $4::interval, $5)`

// supersede is the tail of a statement whose CTE "gone" deleted superseded
// deliveries ($1 is the subscription, $5 its topic): it deletes the
// bodies no other subscription needs, as an Ack does, and counts them.
const supersede = `
, bodies AS (
    DELETE FROM {{schema}}.messages m USING gone WHERE m.id = gone.id
    AND NOT EXISTS (SELECT 1 FROM {{schema}}.deliveries x
        WHERE x.sub_id = ANY (ARRAY(SELECT s.id FROM {{schema}}.subscriptions s WHERE s.topic_id = $5 AND s.id <> $1))
          AND x.id = m.id)
), counted AS (
    INSERT INTO {{schema}}.superseded AS sp (sub_id, slot, n)
    SELECT $1, (random() * 15)::smallint, count(*) FROM gone HAVING count(*) > 0
    ON CONFLICT (sub_id, slot) DO UPDATE SET n = sp.n + excluded.n
)`

// sqlClaimDirectCompact claims direct deliveries (Parallel, or keyless) of
// a compacting subscription ($5 is its topic). Of the ready rows it locks,
// a keyed one is delivered only if no newer message of its key is ready or
// in flight; otherwise it is superseded. For each keyed row it delivers, the
// key's older messages that nobody holds (waiting for a retry or a
// not-before time, or ready but not locked by a concurrent claim) are
// superseded too. A message in flight (leased, lease not expired) is never
// superseded.
//
// Concurrent claims: each locks its rows with SKIP LOCKED and judges them
// with its own snapshot. A row another claim locked is skipped here, and that
// claim sees our newer row as ready (our claim has not committed) and
// supersedes its older one; a newer row a publisher commits after our
// snapshot is claimed later and is newer than anything we deliver.
const sqlClaimDirectCompact = `
WITH c AS (
    SELECT id, msg_key FROM {{schema}}.deliveries
    WHERE sub_id = $1 AND direct AND can_run_after <= now()
    ORDER BY can_run_after, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), v AS (
    SELECT c.id, c.msg_key, c.msg_key IS NOT NULL AND EXISTS (
        SELECT 1 FROM {{schema}}.deliveries n
        WHERE n.sub_id = {{sub}} AND n.direct AND n.msg_key IS NOT NULL AND n.msg_key = c.msg_key AND n.id > c.id
          AND (n.can_run_after <= now() OR n.lease_token IS NOT NULL)) AS sup
    FROM c
), old AS (
    SELECT o.id FROM {{schema}}.deliveries o
    WHERE o.sub_id = {{sub}} AND o.direct AND o.msg_key IS NOT NULL
      AND o.msg_key IN (SELECT v.msg_key FROM v WHERE NOT v.sup AND v.msg_key IS NOT NULL)
      AND o.id < (SELECT max(v.id) FROM v WHERE v.msg_key = o.msg_key AND NOT v.sup)
      AND o.id NOT IN (SELECT v.id FROM v)
      AND (o.lease_token IS NULL OR o.can_run_after <= now())
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM {{schema}}.deliveries d
    WHERE d.sub_id = $1 AND (d.id IN (SELECT v.id FROM v WHERE v.sup) OR d.id IN (SELECT old.id FROM old))
    RETURNING d.id
)` + supersede + `
, du AS (
    UPDATE {{schema}}.deliveries d SET attempts = d.attempts + 1, can_run_after = now() + $3::interval, lease_token = $4
    FROM v WHERE d.sub_id = $1 AND d.id = v.id AND NOT v.sup
    RETURNING d.id, d.attempts
)
SELECT m.id, m.msg_id, m.msg_key, m.payload, m.headers, m.not_before, m.published_at, du.attempts
FROM du JOIN {{schema}}.messages m ON m.id = du.id
ORDER BY m.id`

// sqlNackDirectCompact is sqlNackDirect for a compacting subscription: a
// failed message of a key that has a newer message pending or in flight
// is superseded instead of retried, so its retry never runs after the newer
// one ($5 is the topic).
const sqlNackDirectCompact = `
WITH t AS (
    SELECT d.id, d.msg_key IS NOT NULL AND EXISTS (
        SELECT 1 FROM {{schema}}.deliveries n
        WHERE n.sub_id = {{sub}} AND n.direct AND n.msg_key IS NOT NULL AND n.msg_key = d.msg_key AND n.id > d.id) AS sup
    FROM {{schema}}.deliveries d
    WHERE d.sub_id = $1 AND d.id = $2 AND d.lease_token = $4
    FOR UPDATE
), gone AS (
    DELETE FROM {{schema}}.deliveries d USING t WHERE d.sub_id = $1 AND d.id = t.id AND t.sup
    RETURNING d.id
)` + supersede + `
UPDATE {{schema}}.deliveries d SET can_run_after = now() + $3::interval, lease_token = NULL
FROM t WHERE d.sub_id = $1 AND d.id = t.id AND NOT t.sup`

// compactSQL expands a compacting subscription's query: {{sub}} is its id
// as a literal, so that the planner can use the subscription's partial
// index (sqlCompactIndex) even in a generic plan.
func (s *store) compactSQL(tmpl string, subID int32) string {
	return s.sql(strings.ReplaceAll(tmpl, "{{sub}}", strconv.Itoa(int(subID))))
}

// sqlCompactIndex creates the index a compacting Parallel subscription's
// claims look keys up in ({{sub}}: its id). It is partial on the
// subscription so that no other subscription's publishes maintain it (one
// index over all keyed direct deliveries cost Parallel publishes ~40 %).
// Building it takes a SHARE lock on deliveries: writes wait while it scans
// the table.
const sqlCompactIndex = `CREATE INDEX IF NOT EXISTS deliveries_compact_{{sub}} ON {{schema}}.deliveries (msg_key, id)
    WHERE sub_id = {{sub}} AND direct AND msg_key IS NOT NULL`

// sqlSuperseded sums a subscription's superseded counter.
const sqlSuperseded = `SELECT coalesce(sum(n), 0) FROM {{schema}}.superseded WHERE sub_id = $1`
