-- Runs that ended, per queue and minute (a queue's throughput and failures; the console's
-- charts). Each instance counts its own in memory and its sampler adds them here every
-- metrics_sample_seconds, so a row is the sum of every instance's runs of that minute.
-- Retention deletes rows older than retention_stats_days.
CREATE TABLE queue_minutes (
    queue text NOT NULL,
    minute timestamptz NOT NULL,
    succeeded bigint NOT NULL DEFAULT 0,
    retried bigint NOT NULL DEFAULT 0,
    failed bigint NOT NULL DEFAULT 0,
    cancelled bigint NOT NULL DEFAULT 0,
    interrupted bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, minute)
);
CREATE INDEX queue_minutes_minute_idx ON queue_minutes (minute);
-- A queue's tasks waiting out a retry backoff are counted through this index (only those rows are in it).
CREATE INDEX tasks_retrying_idx ON tasks (queue) WHERE status = 'queued' AND retries > 0;
