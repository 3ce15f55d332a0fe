-- A lost lease counts an attempt only for messages whose handler started
-- (issue 11). 002 counted it on the first unsettled member of the expired
-- chain whether or not that member had started: a chain that sat in its
-- consumer's lanes behind other keys' work, claimed but never run, came
-- back with an attempt counted when the consumer died, and a couple of
-- crashes dead-lettered it unrun.
--
-- Consumers now record which members of a chain started. Members of a
-- chain start in id order (one at a time under Run, a batch together under
-- RunBatch), so one number per lease says it: heads.started_end, the
-- highest id of the leased chain whose handler started under the current
-- lease (NULL: none). The driver writes it asynchronously, batched over the
-- chains that started meanwhile, off the handlers' path; a claim resets it.
--
-- Taking over an expired lease then counts one attempt for every member of
-- the chain up to started_end that is still there and was not nacked under
-- that lease: each one ran, or was running (a member whose Ack had not
-- landed ran too). Members behind started_end never started and count
-- nothing.
--
-- The mark can be late: a handler that kills its process before its mark
-- lands would run again uncounted, and a message that kills every consumer
-- that way would loop. So the first member behind started_end that may
-- have been running (under Ordered the first one there, unless it was
-- nacked under that lease; under Exclusive the first one not nacked under
-- it) has its deliveries.unstarted raised instead of its attempts. A
-- delivery with unstarted > 0 is claimed as suspect: the driver writes its
-- mark before its handler starts (synchronously), so from then on its runs
-- are counted however fast they kill their process. As a backstop against
-- marks that keep failing, the third such loss of one delivery is counted
-- as an attempt anyway.
ALTER TABLE {{schema}}.heads ADD COLUMN started_end bigint;
ALTER TABLE {{schema}}.deliveries ADD COLUMN unstarted smallint NOT NULL DEFAULT 0;

-- The result gains a column (suspect), so the functions are replaced.
DROP FUNCTION {{schema}}.claim_keys(integer, integer, integer, interval, bigint, boolean);
CREATE FUNCTION {{schema}}.claim_keys(p_sub integer, p_keys integer, p_chain integer,
        p_lease interval, p_token bigint, p_ordered boolean)
RETURNS TABLE (id bigint, msg_id text, msg_key text, payload bytea, headers jsonb,
        not_before timestamptz, published_at timestamptz, attempt integer, suspect boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_keys    text[];
    v_ctids   tid[];
    v_expired boolean[];
    v_ends    bigint[];
    v_froms   bigint[];
    v_tokens  bigint[];
    v_started bigint[];
BEGIN
    SELECT array_agg(l.msg_key), array_agg(l.ctid), array_agg(l.lease_token IS NOT NULL), array_agg(l.chain_end),
           array_agg(l.from_id), array_agg(l.lease_token), array_agg(l.started_end)
    INTO v_keys, v_ctids, v_expired, v_ends, v_froms, v_tokens, v_started
    FROM (
        SELECT hd.msg_key, hd.ctid, hd.lease_token, hd.chain_end, hd.from_id, hd.started_end FROM {{schema}}.heads hd
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
        SELECT * FROM unnest(v_keys, v_ctids, v_expired, v_ends, v_froms, v_tokens, v_started)
            AS u(msg_key, row_id, expired, chain_end, from_id, old_token, started_end)
    ), ran AS (
        -- Started under the expired lease, neither settled nor nacked
        -- under it: each ran or was running.
        SELECT d.id, true AS counted, false AS unmarked
        FROM h JOIN {{schema}}.deliveries d
          ON d.sub_id = p_sub AND d.msg_key = h.msg_key AND NOT d.direct
         AND d.id >= h.from_id AND d.id <= h.chain_end AND d.id <= h.started_end
        WHERE h.expired AND h.started_end IS NOT NULL AND d.lease_token IS DISTINCT FROM h.old_token
    ), unmarked AS (
        -- The first member behind the mark that may have been running with
        -- its mark not yet written (see above).
        SELECT f.id, f.unstarted >= 2 AS counted, true AS unmarked FROM h CROSS JOIN LATERAL (
            SELECT d.id, d.lease_token, d.unstarted FROM {{schema}}.deliveries d
            WHERE d.sub_id = p_sub AND d.msg_key = h.msg_key AND NOT d.direct
              AND d.id >= h.from_id AND d.id <= h.chain_end AND d.id > coalesce(h.started_end, -1)
              AND (p_ordered OR d.lease_token IS DISTINCT FROM h.old_token)
            ORDER BY d.id LIMIT 1) f
        WHERE h.expired AND f.lease_token IS DISTINCT FROM h.old_token
    ), lostd AS (
        SELECT * FROM ran UNION ALL SELECT * FROM unmarked
    ), c AS (
        SELECT x.id, x.msg_key,
               x.attempts + CASE WHEN x.id IN (SELECT lostd.id FROM lostd WHERE lostd.counted) THEN 2 ELSE 1 END AS attempt,
               x.unstarted > 0 OR x.id IN (SELECT unmarked.id FROM unmarked) AS suspect
        FROM h CROSS JOIN LATERAL (
            SELECT y.id, y.msg_key, y.attempts, y.unstarted FROM (
                SELECT d.id, d.msg_key, d.attempts, d.unstarted, bool_and(d.can_run_after <= now()) OVER (ORDER BY d.id) AS ok
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
            chain_end = cm.last,
            started_end = NULL
        FROM h LEFT JOIN cm ON cm.msg_key = h.msg_key
        WHERE hd.ctid = h.row_id
    ), lost AS (
        UPDATE {{schema}}.deliveries d SET attempts = d.attempts + lostd.counted::integer,
            unstarted = d.unstarted + lostd.unmarked::integer
        FROM lostd WHERE d.sub_id = p_sub AND d.id = lostd.id
    )
    SELECT m.id, m.msg_id, m.msg_key, m.payload, m.headers, m.not_before, m.published_at, c.attempt, c.suspect
    FROM c JOIN {{schema}}.messages m ON m.id = c.id
    ORDER BY c.msg_key, c.id;
END
$$;

-- claim_keys_compact (003) with the same accounting; its chains are one
-- message long.
DROP FUNCTION {{schema}}.claim_keys_compact(integer, integer, integer, interval, bigint);
CREATE FUNCTION {{schema}}.claim_keys_compact(p_sub integer, p_topic integer, p_keys integer,
        p_lease interval, p_token bigint)
RETURNS TABLE (id bigint, msg_id text, msg_key text, payload bytea, headers jsonb,
        not_before timestamptz, published_at timestamptz, attempt integer, suspect boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_keys    text[];
    v_ctids   tid[];
    v_expired boolean[];
    v_ends    bigint[];
    v_froms   bigint[];
    v_tokens  bigint[];
    v_started bigint[];
BEGIN
    SELECT array_agg(l.msg_key), array_agg(l.ctid), array_agg(l.lease_token IS NOT NULL), array_agg(l.chain_end),
           array_agg(l.from_id), array_agg(l.lease_token), array_agg(l.started_end)
    INTO v_keys, v_ctids, v_expired, v_ends, v_froms, v_tokens, v_started
    FROM (
        SELECT hd.msg_key, hd.ctid, hd.lease_token, hd.chain_end, hd.from_id, hd.started_end FROM {{schema}}.heads hd
        WHERE hd.sub_id = p_sub AND hd.claimable_at <= now()
        ORDER BY hd.claimable_at
        LIMIT p_keys
        FOR UPDATE SKIP LOCKED) l;
    IF v_keys IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH h AS (
        SELECT * FROM unnest(v_keys, v_ctids, v_expired, v_ends, v_froms, v_tokens, v_started)
            AS u(msg_key, row_id, expired, chain_end, from_id, old_token, started_end)
    ), lostd AS (
        -- The one message of the expired chain, unless it was nacked under
        -- that lease: counted when it started, else unmarked.
        SELECT f.id, f.id <= coalesce(h.started_end, -1) OR f.unstarted >= 2 AS counted,
               f.id > coalesce(h.started_end, -1) AS unmarked
        FROM h CROSS JOIN LATERAL (
            SELECT d.id, d.lease_token, d.unstarted FROM {{schema}}.deliveries d
            WHERE d.sub_id = p_sub AND d.msg_key = h.msg_key AND NOT d.direct
              AND d.id >= h.from_id AND d.id <= h.chain_end
              AND d.lease_token IS DISTINCT FROM h.old_token
            ORDER BY d.id LIMIT 1) f
        WHERE h.expired
    ), c AS (
        SELECT x.id, x.msg_key, h.from_id,
               x.attempts + CASE WHEN x.id IN (SELECT lostd.id FROM lostd WHERE lostd.counted) THEN 2 ELSE 1 END AS attempt,
               x.unstarted > 0 OR x.id IN (SELECT lostd.id FROM lostd WHERE lostd.unmarked) AS suspect
        FROM h CROSS JOIN LATERAL (
            SELECT d.id, d.msg_key, d.attempts, d.unstarted FROM {{schema}}.deliveries d
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
            from_id = coalesce(c.id, hd.from_id),
            started_end = NULL
        FROM h LEFT JOIN c ON c.msg_key = h.msg_key
        WHERE hd.ctid = h.row_id
    ), lost AS (
        -- only the claimed message: an older lost one is superseded (gone)
        UPDATE {{schema}}.deliveries d SET attempts = d.attempts + lostd.counted::integer,
            unstarted = d.unstarted + lostd.unmarked::integer
        FROM lostd JOIN c ON c.id = lostd.id WHERE d.sub_id = p_sub AND d.id = lostd.id
    )
    SELECT m.id, m.msg_id, m.msg_key, m.payload, m.headers, m.not_before, m.published_at, c.attempt, c.suspect
    FROM c JOIN {{schema}}.messages m ON m.id = c.id
    ORDER BY c.msg_key, c.id;
END
$$;
