DROP FUNCTION IF EXISTS {{schema}}.claim_keys;
DROP TABLE IF EXISTS {{schema}}.dead_letters, {{schema}}.heads, {{schema}}.deliveries,
    {{schema}}.messages, {{schema}}.subscriptions, {{schema}}.topics;
