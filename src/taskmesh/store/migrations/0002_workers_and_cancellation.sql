-- Worker registry and heartbeats, cancellation requests (docs/internals/design.md, sections 4 and 5).
CREATE TABLE workers (
    id           text PRIMARY KEY,             -- host-pid-random
    host         text NOT NULL,
    pid          integer NOT NULL,
    queues       jsonb NOT NULL,               -- {"queue": concurrency, ...}
    version      text NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    stopped_at   timestamptz,
    state        text NOT NULL CHECK (state IN ('running', 'draining', 'stopped', 'lost'))
);

CREATE INDEX workers_live_idx ON workers (heartbeat_at) WHERE state IN ('running', 'draining');

-- Set by POST /tasks/{id}/cancel on a running task; its worker sees it through the heartbeat.
ALTER TABLE tasks ADD COLUMN cancel_requested_at timestamptz;

-- The heartbeat extends all of a worker's running runs in one statement.
CREATE INDEX task_runs_running_worker_idx ON task_runs (worker_id) WHERE status = 'running';
