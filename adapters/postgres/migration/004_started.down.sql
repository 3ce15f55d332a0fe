-- Back to 002's claim_keys and 003's claim_keys_compact: a lost lease
-- counts on the chain's first unsettled member whether or not it started.
DROP FUNCTION {{schema}}.claim_keys(integer, integer, integer, interval, bigint, boolean);
DROP FUNCTION {{schema}}.claim_keys_compact(integer, integer, integer, interval, bigint);
ALTER TABLE {{schema}}.heads DROP COLUMN started_end;
ALTER TABLE {{schema}}.deliveries DROP COLUMN unstarted;
CREATE FUNCTION {{schema}}.claim_keys(p_sub integer, p_keys integer, p_chain integer,
        p_lease interval, p_token bigint, p_ordered boolean)
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
    -- The locked rows cannot change under us: their values and ctids stay
    -- valid for the second statement.
    RETURN QUERY
    WITH h AS (
        SELECT * FROM unnest(v_keys, v_ctids, v_expired, v_ends, v_froms, v_tokens)
            AS u(msg_key, row_id, expired, chain_end, from_id, old_token)
    ), lostd AS (
        -- The message of each expired chain that may have been running:
        -- under Ordered the first unsettled one, unless it was nacked under
        -- that lease (its attempt is written, and nothing behind it ran);
        -- under Exclusive the first one not nacked under that lease.
        SELECT f.id FROM h CROSS JOIN LATERAL (
            SELECT d.id, d.lease_token FROM {{schema}}.deliveries d
            WHERE d.sub_id = p_sub AND d.msg_key = h.msg_key AND NOT d.direct
              AND d.id >= h.from_id AND d.id <= h.chain_end
              AND (p_ordered OR d.lease_token IS DISTINCT FROM h.old_token)
            ORDER BY d.id LIMIT 1) f
        WHERE h.expired AND f.lease_token IS DISTINCT FROM h.old_token
    ), c AS (
        SELECT x.id, x.msg_key,
               x.attempts + CASE WHEN x.id IN (SELECT lostd.id FROM lostd) THEN 2 ELSE 1 END AS attempt
        FROM h CROSS JOIN LATERAL (
            SELECT y.id, y.msg_key, y.attempts FROM (
                SELECT d.id, d.msg_key, d.attempts, bool_and(d.can_run_after <= now()) OVER (ORDER BY d.id) AS ok
                FROM {{schema}}.deliveries d
                WHERE d.sub_id = p_sub AND d.msg_key = h.msg_key AND NOT d.direct AND d.id >= h.from_id
                  AND (p_ordered OR d.can_run_after <= now())
                ORDER BY d.id LIMIT p_chain
            ) y WHERE y.ok
        ) x
    ), cm AS (
        SELECT c.msg_key, max(c.id) AS last FROM c GROUP BY c.msg_key
    ), hu AS (
        UPDATE {{schema}}.heads hd SET
            claimable_at = CASE WHEN cm.last IS NOT NULL THEN now() + p_lease
                ELSE coalesce((SELECT min(d.can_run_after) FROM {{schema}}.deliveries d
                               WHERE d.sub_id = p_sub AND d.msg_key = hd.msg_key AND NOT d.direct),
                              now() + interval '1 second') END,
            lease_token = CASE WHEN cm.last IS NOT NULL THEN p_token END,
            chain_end = cm.last
        FROM h LEFT JOIN cm ON cm.msg_key = h.msg_key
        WHERE hd.ctid = h.row_id
    ), lost AS (
        UPDATE {{schema}}.deliveries d SET attempts = d.attempts + 1
        FROM lostd WHERE d.sub_id = p_sub AND d.id = lostd.id
    )
    SELECT m.id, m.msg_id, m.msg_key, m.payload, m.headers, m.not_before, m.published_at, c.attempt
    FROM c JOIN {{schema}}.messages m ON m.id = c.id
    ORDER BY c.msg_key, c.id;
END
$$;

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
