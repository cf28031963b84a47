-- The limit keys a task holds (limits/book.py: `<limit>` or `<limit>:<value>`), decided at enqueue
-- from the limits then in force; NULL for a task no limit holds (nearly every task: no index).
-- Claims and status changes return them, so that a run's slots are given back and a pushed id
-- carries its keys to Redis.
ALTER TABLE tasks ADD COLUMN limit_keys text[];

-- Limits set at run time: each row overrides (or adds) the configured limit of its name on every
-- instance, which reads this table every second. `settings`: the limit as configured
-- (limits/settings.py: queue, task, key, concurrency, rate, burst).
CREATE TABLE limits (
    name text PRIMARY KEY,
    settings jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    updated_by text
);

-- Debounce: a task created with a debounce key waits, and a later create of the same key (and tenant)
-- replaces its payload and pushes its start back while it has not started, never past
-- `debounce_max_at` (the first create's time plus its max_wait). 0028 indexes the keys of such tasks.
ALTER TABLE tasks ADD COLUMN debounce_key text;
ALTER TABLE tasks ADD COLUMN debounce_max_at timestamptz;
