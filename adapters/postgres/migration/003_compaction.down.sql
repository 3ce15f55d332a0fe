DROP FUNCTION {{schema}}.claim_keys_compact(integer, integer, integer, interval, bigint);
-- The indexes of compacting Parallel subscriptions (deliveries_compact_<id>).
DO $$
DECLARE i record;
BEGIN
    FOR i IN SELECT x.indexrelid::regclass AS idx FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
             WHERE x.indrelid = '{{schema}}.deliveries'::regclass AND c.relname LIKE 'deliveries\_compact\_%' LOOP
        EXECUTE 'DROP INDEX ' || i.idx::text;
    END LOOP;
END $$;
DROP TABLE {{schema}}.superseded;
ALTER TABLE {{schema}}.subscriptions DROP CONSTRAINT subscriptions_compact_not_ordered;
ALTER TABLE {{schema}}.subscriptions DROP COLUMN compact;
