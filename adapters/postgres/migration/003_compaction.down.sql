DROP FUNCTION {{schema}}.claim_keys_compact(integer, integer, integer, interval, bigint);
DROP INDEX {{schema}}.deliveries_direct_key;
DROP TABLE {{schema}}.superseded;
ALTER TABLE {{schema}}.subscriptions DROP CONSTRAINT subscriptions_compact_not_ordered;
ALTER TABLE {{schema}}.subscriptions DROP COLUMN compact;
