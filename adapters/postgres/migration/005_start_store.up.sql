-- The start store (postgres.NewStartStore): how many times the handler of
-- a message of another broker's subscription started (an SQS queue, a
-- Pub/Sub subscription; see driver.StartStore). One row per message copy
-- that ran at least once and was not settled before its run was recorded;
-- the driver deletes a row when its message is settled, and rows older
-- than the store's retention are deleted by StartStore.Expire.
CREATE TABLE {{schema}}.start_runs (
    sub        text NOT NULL,
    msg_id     text NOT NULL,
    runs       integer NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sub, msg_id)
);
CREATE INDEX start_runs_updated_at ON {{schema}}.start_runs (updated_at);
