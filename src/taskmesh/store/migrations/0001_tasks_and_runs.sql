-- tasks and task_runs (docs/internals/design.md section 4).
CREATE TABLE tasks (
    id              uuid PRIMARY KEY,
    name            text NOT NULL,
    type            text NOT NULL CHECK (type IN ('immediate', 'delayed', 'cron')),
    queue           text NOT NULL,
    priority        integer NOT NULL,
    payload         jsonb NOT NULL,
    idempotency_key text,
    max_retries     integer NOT NULL CHECK (max_retries >= 0),
    retries         integer NOT NULL DEFAULT 0,   -- spent in this delivery cycle
    attempts        integer NOT NULL DEFAULT 0,   -- runs claimed over the task's life
    status          text NOT NULL CHECK (status IN ('queued', 'running', 'completed', 'failed', 'cancelled')),
    run_at          timestamptz NOT NULL,
    tenant_id       text,
    trace_id        text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE UNIQUE INDEX tasks_idempotency_key_key ON tasks (idempotency_key);
-- Hot lookups stay small however long the history grows: only live rows are indexed.
CREATE INDEX tasks_queued_idx ON tasks (queue, run_at) WHERE status = 'queued';
CREATE INDEX tasks_failed_idx ON tasks (queue, updated_at) WHERE status = 'failed';

CREATE TABLE task_runs (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    task_id          uuid NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    attempt          integer NOT NULL CHECK (attempt >= 1),
    status           text NOT NULL CHECK (status IN ('queued', 'running', 'succeeded', 'retrying', 'failed')),
    worker_id        text,
    claimed_at       timestamptz,
    started_at       timestamptz,
    finished_at      timestamptz,
    lease_expires_at timestamptz,
    next_retry_at    timestamptz,
    error            text,
    result           jsonb,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (task_id, attempt)
);

CREATE INDEX task_runs_running_lease_idx ON task_runs (lease_expires_at) WHERE status = 'running';
