DROP TABLE {{schema}}.start_runs;
