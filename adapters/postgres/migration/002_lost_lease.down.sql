-- Back to 001's claim_keys.
CREATE OR REPLACE FUNCTION {{schema}}.claim_keys(p_sub integer, p_keys integer, p_chain integer,
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
BEGIN
    SELECT array_agg(l.msg_key), array_agg(l.ctid), array_agg(l.lease_token IS NOT NULL), array_agg(l.chain_end),
           array_agg(l.from_id)
    INTO v_keys, v_ctids, v_expired, v_ends, v_froms
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
        SELECT * FROM unnest(v_keys, v_ctids, v_expired, v_ends, v_froms) AS u(msg_key, row_id, expired, chain_end, from_id)
    ), c AS (
        SELECT x.id, x.msg_key,
               x.attempts + CASE WHEN h.expired AND x.id <= h.chain_end THEN 2 ELSE 1 END AS attempt
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
        FROM h WHERE h.expired AND d.sub_id = p_sub AND d.msg_key = h.msg_key AND NOT d.direct
          AND d.id <= h.chain_end
    )
    SELECT m.id, m.msg_id, m.msg_key, m.payload, m.headers, m.not_before, m.published_at, c.attempt
    FROM c JOIN {{schema}}.messages m ON m.id = c.id
    ORDER BY c.msg_key, c.id;
END
$$;
