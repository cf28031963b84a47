-- Cron schedules mirrored from config (docs/internals/design.md, section 4).
-- One row per declared schedule; instances upsert their declarations at start and
-- take a due row with FOR UPDATE SKIP LOCKED, so one fire is made once however
-- many instances run (the task's idempotency key cron:{name}:{fire} backs that up).
CREATE TABLE schedules (
    name                  text PRIMARY KEY,
    cron                  text NOT NULL,
    timezone              text NOT NULL,
    task                  text NOT NULL,
    queue                 text,
    priority              integer NOT NULL,
    payload               jsonb NOT NULL,
    max_retries           integer,
    misfire               text NOT NULL CHECK (misfire IN ('skip', 'once', 'all')),
    misfire_grace_seconds double precision NOT NULL,
    overlap               text NOT NULL CHECK (overlap IN ('allow', 'skip')),
    enabled               boolean NOT NULL,
    paused                boolean NOT NULL DEFAULT false,
    config_hash           text NOT NULL,
    last_fire_at          timestamptz,
    next_fire_at          timestamptz,
    last_task_id          uuid,
    synced_at             timestamptz NOT NULL DEFAULT now(),
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now()
);
