-- Compaction (issue 13): a subscription created with compact delivers, for
-- each key, only the newest message waiting when the key is claimed; the
-- older waiting ones are resolved as superseded (deleted and counted, never
-- dead letters). Ordered refuses it: its guarantee is the key's history.
ALTER TABLE {{schema}}.subscriptions ADD COLUMN compact boolean NOT NULL DEFAULT false;
ALTER TABLE {{schema}}.subscriptions ADD CONSTRAINT subscriptions_compact_not_ordered
    CHECK (NOT (compact AND ordering = 2));

-- Superseded messages per subscription, spread over a few slots so that
-- concurrent claims rarely wait on one counter row. Stats sum the slots.
CREATE TABLE {{schema}}.superseded (
    sub_id integer NOT NULL,
    slot   smallint NOT NULL,
    n      bigint NOT NULL,
    PRIMARY KEY (sub_id, slot)
);

-- A Parallel subscription's keyed deliveries are direct (claimed row by
-- row); compaction looks up the other deliveries of a claimed row's key.
-- The index for that is created with each compacting Parallel
-- subscription (deliveries_compact_<id>, partial on its sub_id), not here:
-- one index over every Parallel subscription's keyed deliveries cost ~40 %
-- of their publish rate (measured: 38k vs 62k msgs/s).

-- claim_keys_compact is claim_keys for an Exclusive subscription with
-- compaction: for each claimable key it takes one message, the newest one
-- that is ready, and supersedes every older message of the key, ready or
-- waiting (for a retry or a not-before time).
--
-- Why nothing is lost and nothing older follows something newer:
-- * The head is locked as in claim_keys (FOR UPDATE SKIP LOCKED) and the
--   deliveries are read by a second statement with a fresh snapshot.
--   Publishers of the key lock the head before they draw message ids, so
--   while we hold it no id of the key can appear: the newest ready message
--   we read is the newest there is, and a publish that raced us either
--   committed before our snapshot (we see it: it is the newest, or newer
--   than it and not ready) or waits for our commit and gets a larger id,
--   delivered after ours. Nothing with a smaller id can arrive later.
-- * A claimable head is not leased (or its lease expired): no message of
--   the key is in flight, so nothing superseded is running. A consumer
--   whose lease expired may still be running its message; it lost the key
--   when its lease ran out, like any lost consumer, and its late Ack or
--   Nack finds the row gone or the head no longer its own.
-- * Only messages with a smaller id than the claimed one are superseded;
--   newer ones that are not ready (a not-before time) stay and are claimed
--   when due.
-- * Superseded deliveries are deleted with their bodies (when no other
--   subscription needs them) and counted in the same transaction.
-- * A lost lease counts one attempt against the message that may have
--   been running (as 002), when that message is the one claimed again.
CREATE FUNCTION {{schema}}.claim_keys_compact(p_sub integer, p_topic integer, p_keys integer,
        p_lease interval, p_token bigint)
RETURNS TABLE (id bigint, msg_id text, msg_key text, payload bytea, headers jsonb,
        not_before timestamptz, published_at timestamptz, attempt integer)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_keys    text[];
    v_ctids   tid[];
    v_expired boolean[];
    v_ends    bigint[];
    v_froms   bigint[];
    v_tokens  bigint[];
BEGIN
    SELECT array_agg(l.msg_key), array_agg(l.ctid), array_agg(l.lease_token IS NOT NULL), array_agg(l.chain_end),
           array_agg(l.from_id), array_agg(l.lease_token)
    INTO v_keys, v_ctids, v_expired, v_ends, v_froms, v_tokens
    FROM (
        SELECT hd.msg_key, hd.ctid, hd.lease_token, hd.chain_end, hd.from_id FROM {{schema}}.heads hd
        WHERE hd.sub_id = p_sub AND hd.claimable_at <= now()
        ORDER BY hd.claimable_at
        LIMIT p_keys
        FOR UPDATE SKIP LOCKED) l;
    IF v_keys IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH h AS (
        SELECT * FROM unnest(v_keys, v_ctids, v_expired, v_ends, v_froms, v_tokens)
            AS u(msg_key, row_id, expired, chain_end, from_id, old_token)
    ), lostd AS (
        SELECT f.id FROM h CROSS JOIN LATERAL (
            SELECT d.id, d.lease_token FROM {{schema}}.deliveries d
            WHERE d.sub_id = p_sub AND d.msg_key = h.msg_key AND NOT d.direct
              AND d.id >= h.from_id AND d.id <= h.chain_end
              AND d.lease_token IS DISTINCT FROM h.old_token
            ORDER BY d.id LIMIT 1) f
        WHERE h.expired
    ), c AS (
        SELECT x.id, x.msg_key, h.from_id,
               x.attempts + CASE WHEN x.id IN (SELECT lostd.id FROM lostd) THEN 2 ELSE 1 END AS attempt
        FROM h CROSS JOIN LATERAL (
            SELECT d.id, d.msg_key, d.attempts FROM {{schema}}.deliveries d
            WHERE d.sub_id = p_sub AND d.msg_key = h.msg_key AND NOT d.direct AND d.id >= h.from_id
              AND d.can_run_after <= now()
            ORDER BY d.id DESC LIMIT 1
        ) x
    ), gone AS (
        DELETE FROM {{schema}}.deliveries d USING c
        WHERE d.sub_id = p_sub AND d.msg_key = c.msg_key AND NOT d.direct AND d.id >= c.from_id AND d.id < c.id
        RETURNING d.id
    ), bodies AS (
        DELETE FROM {{schema}}.messages m USING gone WHERE m.id = gone.id
        AND NOT EXISTS (SELECT 1 FROM {{schema}}.deliveries x
            WHERE x.sub_id = ANY (ARRAY(SELECT s.id FROM {{schema}}.subscriptions s WHERE s.topic_id = p_topic AND s.id <> p_sub))
              AND x.id = m.id)
    ), counted AS (
        INSERT INTO {{schema}}.superseded AS sp (sub_id, slot, n)
        SELECT p_sub, (random() * 15)::smallint, count(*) FROM gone HAVING count(*) > 0
        ON CONFLICT (sub_id, slot) DO UPDATE SET n = sp.n + excluded.n
    ), hu AS (
        UPDATE {{schema}}.heads hd SET
            claimable_at = CASE WHEN c.id IS NOT NULL THEN now() + p_lease
                ELSE coalesce((SELECT min(d.can_run_after) FROM {{schema}}.deliveries d
                               WHERE d.sub_id = p_sub AND d.msg_key = hd.msg_key AND NOT d.direct),
                              now() + interval '1 second') END,
            lease_token = CASE WHEN c.id IS NOT NULL THEN p_token END,
            chain_end = c.id,
            from_id = coalesce(c.id, hd.from_id)
        FROM h LEFT JOIN c ON c.msg_key = h.msg_key
        WHERE hd.ctid = h.row_id
    ), lost AS (
        -- only the claimed message: an older lost one is superseded (gone)
        UPDATE {{schema}}.deliveries d SET attempts = d.attempts + 1
        FROM lostd JOIN c ON c.id = lostd.id WHERE d.sub_id = p_sub AND d.id = lostd.id
    )
    SELECT m.id, m.msg_id, m.msg_key, m.payload, m.headers, m.not_before, m.published_at, c.attempt
    FROM c JOIN {{schema}}.messages m ON m.id = c.id
    ORDER BY c.msg_key, c.id;
END
$$;
