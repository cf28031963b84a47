-- All SQL of taskmesh, one named block each ("-- name: <entity>_<verb>").
-- Loaded once by store/postgres.py; called through taskmesh.tasks.

-- name: task_insert
-- Insert a task and its first run (attempt 1, queued) in one statement; a
-- repeated idempotency key inserts nothing and returns no row.
WITH t AS (
    INSERT INTO tasks (id, name, type, queue, priority, payload, idempotency_key,
                       max_retries, status, run_at, tenant_id, trace_id)
    VALUES ($1, $2, $3, $4, $5, $6::text::jsonb, $7, $8, 'queued', $9, $10, $11)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id
), r AS (
    INSERT INTO task_runs (task_id, attempt, status)
    SELECT id, 1, 'queued' FROM t
)
SELECT id FROM t;

-- name: task_find_by_idempotency_key
SELECT id, status FROM tasks WHERE idempotency_key = $1;

-- name: task_get
SELECT id, name, type, queue, priority, payload::text AS payload, idempotency_key,
       max_retries, retries, attempts, status, run_at, tenant_id, trace_id,
       created_at, updated_at
FROM tasks WHERE id = $1;

-- name: run_list_by_task
SELECT id, task_id, attempt, status, worker_id, claimed_at, started_at, finished_at,
       lease_expires_at, next_retry_at, error, result::text AS result, created_at, updated_at
FROM task_runs WHERE task_id = $1 ORDER BY attempt;

-- name: run_get_latest
SELECT id, task_id, attempt, status, worker_id, claimed_at, started_at, finished_at,
       lease_expires_at, next_retry_at, error, result::text AS result, created_at, updated_at
FROM task_runs WHERE task_id = $1 ORDER BY attempt DESC LIMIT 1;

-- name: task_claim_many
-- Design.md principle 3: one conditional UPDATE claims the batch; a task that
-- is no longer queued (claimed elsewhere, cancelled) is simply not returned.
-- The claimed attempt's run row is created, or its queued row taken over.
WITH claimed AS (
    UPDATE tasks
    SET status = 'running', attempts = attempts + 1, updated_at = now()
    WHERE id = ANY($1::uuid[]) AND queue = $2 AND status = 'queued'
    RETURNING id, name, queue, priority, payload::text AS payload, attempts, retries,
              max_retries, idempotency_key, trace_id, tenant_id
), runs AS (
    INSERT INTO task_runs (task_id, attempt, status, worker_id, claimed_at, started_at, lease_expires_at)
    SELECT id, attempts, 'running', $3, now(), now(), now() + make_interval(secs => $4)
    FROM claimed
    ON CONFLICT (task_id, attempt) DO UPDATE
    SET status = 'running', worker_id = EXCLUDED.worker_id, claimed_at = EXCLUDED.claimed_at,
        started_at = EXCLUDED.started_at, lease_expires_at = EXCLUDED.lease_expires_at,
        updated_at = now()
    RETURNING id, task_id
)
SELECT c.*, runs.id AS run_id FROM claimed c JOIN runs ON runs.task_id = c.id;

-- name: run_finish_many
-- Write a batch of run results and their tasks' next state in one statement.
-- outcome: succeeded | retry | failed | interrupted. Fenced: only a run that is
-- still running under this worker is written (a late result changes nothing).
WITH r AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::float8[])
        AS r(run_id, task_id, outcome, error, result, delay_s)
), runs AS (
    UPDATE task_runs tr
    SET status = CASE r.outcome WHEN 'succeeded' THEN 'succeeded'
                                WHEN 'failed' THEN 'failed'
                                ELSE 'retrying' END,
        finished_at = now(),
        error = r.error,
        result = r.result::jsonb,
        next_retry_at = CASE WHEN r.outcome IN ('retry', 'interrupted')
                             THEN now() + make_interval(secs => r.delay_s) END,
        lease_expires_at = NULL,
        updated_at = now()
    FROM r
    WHERE tr.id = r.run_id AND tr.status = 'running' AND tr.worker_id = $7
    RETURNING tr.id, tr.next_retry_at
)
UPDATE tasks t
SET status = CASE r.outcome WHEN 'succeeded' THEN 'completed'
                            WHEN 'failed' THEN 'failed'
                            ELSE 'queued' END,
    retries = t.retries + CASE WHEN r.outcome = 'retry' THEN 1 ELSE 0 END,
    run_at = COALESCE(runs.next_retry_at, t.run_at),
    updated_at = now()
FROM r JOIN runs ON runs.id = r.run_id
WHERE t.id = r.task_id AND t.status = 'running'
RETURNING t.id, t.queue, t.priority, t.status, t.run_at;

-- name: task_list_failed
-- The dead-letter queue of one queue, oldest first (Postgres is the truth; the
-- Redis list is its mirror).
SELECT id, name, type, queue, priority, payload::text AS payload, idempotency_key,
       max_retries, retries, attempts, status, run_at, tenant_id, trace_id,
       created_at, updated_at
FROM tasks WHERE queue = $1 AND status = 'failed'
ORDER BY updated_at, id LIMIT $2;

-- name: task_replay_many
-- Move up to $2 dead-lettered tasks of queue $1 back to queued, oldest first,
-- with a fresh retry budget and, when $3 is not null, a new priority.
WITH picked AS (
    SELECT id FROM tasks
    WHERE queue = $1 AND status = 'failed'
    ORDER BY updated_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE tasks t
    SET status = 'queued', retries = 0, priority = COALESCE($3, t.priority),
        run_at = now(), updated_at = now()
    FROM picked WHERE t.id = picked.id
    RETURNING t.id, t.queue, t.priority, t.attempts
), runs AS (
    INSERT INTO task_runs (task_id, attempt, status)
    SELECT id, attempts + 1, 'queued' FROM upd
    ON CONFLICT (task_id, attempt) DO NOTHING
)
SELECT id, queue, priority FROM upd;

-- name: task_list_queued_stale
-- Queued tasks of the given queues created or made ready more than $2 seconds
-- ago, oldest first: candidates for a re-push into Redis.
SELECT id, queue, priority, run_at FROM tasks
WHERE status = 'queued' AND queue = ANY($1::text[])
  AND updated_at < now() - make_interval(secs => $2)
ORDER BY run_at
LIMIT $3;

-- name: task_count_by_status
SELECT status, count(*)::bigint AS n FROM tasks WHERE queue = $1 GROUP BY status;
