-- All SQL of taskmesh, one named block each ("-- name: <entity>_<verb>").
-- Loaded once by store/postgres.py and called through one typed method per block
-- (store/task_queries.py, worker_queries.py, schedule_queries.py). Due times and
-- leases are computed with PostgreSQL's clock (now()), the one clock of record.

-- ======================================================================
-- tasks and runs
-- ======================================================================
-- Every statement that changes a task's status returns the same transition row per task it
-- changed: `id, queue, priority, status, run_at, limit_keys` (the status it has now), which
-- Tasks.mirror turns into the Redis follow-up, one path for all of them. What PostgreSQL must
-- do after a change (a workflow's children) is migration 0025's trigger, in the same transaction.

-- name: task_insert_many
-- Bulk enqueue: every task in one statement, as the enqueue plan made them (tasks/enqueue_plan.py:
-- an enqueue's, a schedule's fires, a workflow's nodes). No run row yet: the first claim writes
-- it (until then the task shows a pending run built from its row). A workflow's task comes
-- `blocked` when it waits for its deps.
-- Repeated idempotency keys (in the table or within the batch) insert nothing.
-- run_at: the given instant (a past one, however old, means now), else
-- now() + the delay (0 for an immediate task), so an instance whose clock runs ahead cannot
-- park a task in the future.
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::int[], $6::text[], $7::text[],
                         $8::int[], $9::timestamptz[], $10::float8[], $11::text[], $12::text[], $13::text[],
                         $14::uuid[], $15::text[], $16::int[], $17::float8[], $18::text[])
        AS i(id, name, type, queue, priority, payload, idempotency_key, max_retries, run_at, delay_s,
             tenant_id, trace_id, status, workflow_id, workflow_node, map_index, timeout_s, limit_keys)
), t AS (
    INSERT INTO tasks (id, name, type, queue, priority, payload, idempotency_key,
                       max_retries, status, run_at, tenant_id, trace_id, workflow_id, workflow_node, map_index,
                       timeout_s, limit_keys)
    SELECT id, name, type, queue, priority, payload::jsonb, idempotency_key, max_retries, status,
           CASE WHEN run_at IS NULL THEN now() + make_interval(secs => COALESCE(delay_s, 0))
                ELSE GREATEST(run_at, now()) END,  -- GREATEST skips nulls: hence the CASE
           tenant_id, trace_id, workflow_id, workflow_node, map_index, timeout_s,
           string_to_array(limit_keys, E'\n')  -- one text per task: unnest cannot take an array of arrays
    FROM input
    ON CONFLICT (idempotency_key, (COALESCE(tenant_id, ''))) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, run_at
)
SELECT id, run_at, run_at > now() AS delayed FROM t;

-- name: task_debounce_many
-- Debounced creates: each task waits $19 seconds; a task of the same debounce key and tenant that has
-- not started yet (0028's index) is replaced instead: its payload and priority become the new ones
-- and its start moves to now + the wait, never past its first create's cap (debounce_max_at, from
-- max_wait $20; null: no cap). The caller gives one task per (key, tenant): a statement cannot
-- update one row twice. `inserted`: a new task; else the replaced one's id.
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int[], $5::text[], $6::int[], $7::text[],
                         $8::text[], $9::float8[], $10::text[], $11::text[], $12::float8[], $13::float8[])
        AS i(id, name, queue, priority, payload, max_retries, tenant_id, trace_id, timeout_s, limit_keys,
             debounce_key, wait_s, max_wait_s)
)
INSERT INTO tasks AS t (id, name, type, queue, priority, payload, max_retries, status, run_at, tenant_id, trace_id,
                        timeout_s, limit_keys, debounce_key, debounce_max_at)
SELECT id, name, 'delayed', queue, priority, payload::jsonb, max_retries, 'queued',
       now() + make_interval(secs => wait_s), tenant_id, trace_id, timeout_s, string_to_array(limit_keys, E'\n'),
       debounce_key, now() + make_interval(secs => max_wait_s)
FROM input
ON CONFLICT (debounce_key, (COALESCE(tenant_id, ''))) WHERE status = 'queued' AND attempts = 0 AND debounce_key IS NOT NULL
DO UPDATE SET payload = EXCLUDED.payload, priority = EXCLUDED.priority,
              run_at = LEAST(EXCLUDED.run_at, t.debounce_max_at), updated_at = now()
RETURNING t.id, t.queue, t.priority, t.run_at, t.run_at > now() AS delayed, (t.xmax = 0) AS inserted, t.debounce_key,
          t.tenant_id, t.trace_id, t.limit_keys;

-- name: task_find_by_idempotency_keys
-- The tasks of (dedup key, tenant) pairs; '' is no tenant (dedup keys are unique per tenant).
SELECT t.idempotency_key, COALESCE(t.tenant_id, '') AS tenant, t.id, t.status, t.trace_id
FROM unnest($1::text[], $2::text[]) AS k(key, tenant)
JOIN tasks t ON t.idempotency_key = k.key AND COALESCE(t.tenant_id, '') = k.tenant
WHERE t.idempotency_key IS NOT NULL;  -- the dedup index holds keyed tasks only (0019)

-- name: task_get_with_latest_run
-- A task and its latest run read in one statement, so both come from one snapshot. A task never
-- claimed has no run row: its latest run is then the pending first one (see 0017's migration).
SELECT t.id, t.name, t.type, t.queue, t.priority, t.payload::text AS payload, t.idempotency_key,
       t.max_retries, t.retries, t.attempts, t.status, t.run_at, t.tenant_id, t.trace_id,
       t.created_at, t.updated_at, t.workflow_id, t.workflow_node, t.map_index,
       t.limit_keys, t.run_at > now() AS delayed,
       EXISTS (SELECT 1 FROM queues q WHERE q.name = t.queue AND q.paused_at IS NOT NULL) AS queue_paused,
       r.id AS run_id, r.attempt AS run_attempt, r.status AS run_status, r.worker_id AS run_worker_id,
       r.claimed_at AS run_claimed_at, r.started_at AS run_started_at, r.finished_at AS run_finished_at,
       r.lease_expires_at AS run_lease_expires_at, r.next_retry_at AS run_next_retry_at,
       r.error AS run_error, r.result::text AS run_result, r.created_at AS run_created_at,
       r.updated_at AS run_updated_at
FROM tasks t
LEFT JOIN LATERAL (
    SELECT * FROM (
        (SELECT *, 0 AS pending FROM task_runs WHERE task_id = t.id ORDER BY attempt DESC LIMIT 1)
        UNION ALL
        -- a task not claimed yet: its pending first run, as the claim will write it
        SELECT taskmesh_run_id(t.id, 1), t.id, 1, 'queued', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               t.created_at, t.created_at, NULL, 1
        WHERE t.status = 'queued' AND t.attempts = 0
    ) runs ORDER BY attempt DESC, pending LIMIT 1
) r ON true
WHERE t.id = $1;

-- name: task_exists
SELECT EXISTS (SELECT 1 FROM tasks WHERE id = $1);

-- name: task_lock_tenants
-- The transaction-scoped advisory locks of tenants whose max_queued quota a create must hold
-- (queued_quota.py), one per tenant (class 29805, 'tm'; key the tenant's hash: two tenants that
-- share one only wait for each other), taken in one order so that two batches cannot deadlock.
-- Returns the transaction's isolation ($2: the setting's name): only READ COMMITTED counts
-- what committed meanwhile.
SELECT current_setting($2) AS isolation, count(pg_advisory_xact_lock(29805, k)) AS locked
FROM (SELECT DISTINCT hashtext(t) AS k FROM unnest($1::text[]) AS t ORDER BY k) s;

-- name: task_count_open_of_tenants
-- Each tenant's queued or running tasks (its own transaction's new ones included), counted up
-- to its $2 through tasks_tenant_open_idx.
SELECT t.tenant,
       (SELECT count(*) FROM (SELECT 1 FROM tasks
                              WHERE tenant_id = t.tenant AND status IN ('queued', 'running')
                              LIMIT t.most) s)::int AS open
FROM unnest($1::text[], $2::int[]) AS t(tenant, most);

-- name: task_owner
-- Whose a task is: its tenant and queue, for a key bound to a tenant or queues.
SELECT tenant_id, queue FROM tasks WHERE id = $1;

-- name: run_list_by_task
-- Every run of a task by attempt; a task never claimed lists its pending first run.
SELECT id, task_id, attempt, status, worker_id, claimed_at, started_at, finished_at,
       lease_expires_at, next_retry_at, error, traceback, result::text AS result, created_at, updated_at
FROM task_runs WHERE task_id = $1
UNION ALL
SELECT taskmesh_run_id(t.id, 1), t.id, 1, 'queued', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       t.created_at, t.created_at
FROM tasks t
WHERE t.id = $1 AND t.status = 'queued' AND t.attempts = 0
  AND NOT EXISTS (SELECT 1 FROM task_runs r WHERE r.task_id = t.id)
ORDER BY attempt;

-- name: task_claim_many
-- Design.md principle 3: one conditional UPDATE claims the batch; a task that
-- is no longer queued (claimed elsewhere, cancelled), not yet due (a stray
-- id pushed early) or in a paused queue is simply not returned.
-- The claimed attempt's run row is created (its id the pending run's: taskmesh_run_id), or
-- the queued row of a requeue (or of an enqueue before migration 0017) taken over.
-- `status || ''` and `queue || ''` keep the planner off the partial index of queued tasks
-- and the (queue, created_at, id) index: with a cached generic plan it would otherwise scan
-- every queued task of the queue (a backlog) instead of looking the popped ids up by primary
-- key. Every run's id is taskmesh_run_id(task, attempt), a queued row's taken over too, so
-- the claimed batch is returned without joining the inserted runs back.
WITH claimed AS (
    UPDATE tasks
    SET status = 'running', attempts = attempts + 1, updated_at = now()
    WHERE id = ANY($1::uuid[]) AND queue || '' = $2 AND status || '' = 'queued' AND run_at <= now()
      AND NOT EXISTS (SELECT 1 FROM queues p WHERE p.name = $2 AND p.paused_at IS NOT NULL)
    RETURNING id, name, queue, priority, payload::text AS payload, attempts, retries,
              max_retries, idempotency_key, trace_id, tenant_id, run_at, workflow_id, workflow_node, map_index,
              timeout_s, limit_keys
), runs AS (
    INSERT INTO task_runs (id, task_id, attempt, status, worker_id, claimed_at, started_at, lease_expires_at)
    SELECT taskmesh_run_id(id, attempts), id, attempts, 'running', $3, now(), now(), now() + make_interval(secs => $4)
    FROM claimed
    ON CONFLICT (task_id, attempt) DO UPDATE
    SET id = EXCLUDED.id, status = 'running', worker_id = EXCLUDED.worker_id, claimed_at = EXCLUDED.claimed_at,
        started_at = EXCLUDED.started_at, lease_expires_at = EXCLUDED.lease_expires_at,
        error = NULL, result = NULL, traceback = NULL, finished_at = NULL, next_retry_at = NULL,
        updated_at = now()
)
SELECT c.*, taskmesh_run_id(c.id, c.attempts) AS run_id FROM claimed c;

-- name: task_list_unclaimed_queued
-- Of ids whose claim failed, the ones still queued: not due yet (a stray or early id; `delayed`)
-- or due in a paused queue. Claimed elsewhere, cancelled or finished ones are not returned.
-- The reconciler asks it too, of ids missing from Redis, before it pushes them back.
SELECT id, queue, priority, run_at, run_at > now() AS delayed, limit_keys FROM tasks
WHERE id = ANY($1::uuid[]) AND status || '' = 'queued';  -- by primary key, not the queued backlog's index

-- name: run_finish_many
-- Write a batch of run results and their tasks' next state in one statement.
-- outcome: succeeded | retry | failed | interrupted | cancelled. Fenced: only a run that is
-- still running under this worker is written (a late result changes nothing).
-- A task whose cancellation was requested while it ran is not retried or requeued: a failed,
-- retried or interrupted run ends it cancelled (a run that succeeded still completes it).
WITH r AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::float8[], $7::text[])
        AS r(run_id, task_id, outcome, error, result, delay_s, traceback)
), runs AS (
    UPDATE task_runs tr
    SET status = CASE WHEN r.outcome = 'succeeded' THEN 'succeeded'
                      WHEN r.outcome IN ('failed', 'cancelled') OR t.cancel_requested_at IS NOT NULL
                          THEN 'failed'
                      ELSE 'retrying' END,
        finished_at = now(),
        error = CASE WHEN r.outcome <> 'succeeded' AND r.outcome <> 'cancelled'
                          AND t.cancel_requested_at IS NOT NULL
                     THEN r.error || ' (not retried: the task was cancelled)'
                     ELSE r.error END,
        traceback = r.traceback,
        result = r.result::jsonb,
        next_retry_at = CASE WHEN r.outcome IN ('retry', 'interrupted') AND t.cancel_requested_at IS NULL
                             THEN now() + make_interval(secs => r.delay_s) END,
        lease_expires_at = NULL,
        updated_at = now()
    FROM r JOIN tasks t ON t.id = r.task_id
    WHERE tr.id = r.run_id AND tr.status = 'running' AND tr.worker_id = $8
    -- the outcome comes back with each written run: the tasks' update below joins nothing else
    RETURNING tr.task_id, tr.next_retry_at, r.outcome
)
UPDATE tasks t
SET status = CASE WHEN runs.outcome = 'succeeded' THEN 'completed'
                  WHEN runs.outcome = 'cancelled' OR t.cancel_requested_at IS NOT NULL THEN 'cancelled'
                  WHEN runs.outcome = 'failed' THEN 'failed'
                  ELSE 'queued' END,
    retries = t.retries + CASE WHEN runs.outcome = 'retry' AND t.cancel_requested_at IS NULL THEN 1 ELSE 0 END,
    run_at = COALESCE(runs.next_retry_at, t.run_at),
    updated_at = now()
FROM runs
-- `status || ''`: by primary key from each written run. Planned on statistics that saw no
-- running task (autovacuum analyzed while only history was there), the generic plan otherwise
-- read every running task through the status index and compared each with every written run.
WHERE t.id = runs.task_id AND t.status || '' = 'running'
RETURNING t.id, t.queue, t.priority, t.status, t.run_at, t.limit_keys;

-- name: run_reclaim_expired
-- End runs whose lease expired: their instance died, froze, or no longer holds them
-- (a live instance's heartbeat extends exactly the runs it holds). error = 'lease
-- expired'; the task is retried (an attempt spent, backoff min(2^n, 3600) s with
-- jitter x0.5-1.5), failed when its retries are spent, or cancelled when that was
-- requested. Rows locked elsewhere (a committer writing the same run) are skipped
-- and looked at again next tick.
WITH expired AS (
    SELECT tr.id, tr.task_id FROM task_runs tr
    WHERE tr.status = 'running' AND tr.lease_expires_at < now()
      -- Right after a PostgreSQL restart no heartbeat could be written for a while; give
      -- live workers $1 seconds (a lease) to beat again before judging their runs.
      AND pg_postmaster_start_time() < now() - make_interval(secs => $1)
    ORDER BY tr.lease_expires_at
    LIMIT $2
    FOR UPDATE OF tr SKIP LOCKED
), decided AS (
    SELECT e.id AS run_id, t.id AS task_id,
           CASE WHEN t.cancel_requested_at IS NOT NULL THEN 'cancelled'
                WHEN t.retries < t.max_retries THEN 'retry'
                ELSE 'failed' END AS outcome,
           (least(power(2, least(t.retries, 12)), 3600) * (0.5 + random()))::float8 AS delay_s
    FROM expired e JOIN tasks t ON t.id = e.task_id
    WHERE t.status || '' = 'running'  -- by primary key, as in run_finish_many
), runs AS (
    UPDATE task_runs tr
    SET status = CASE d.outcome WHEN 'retry' THEN 'retrying' ELSE 'failed' END,
        finished_at = now(),
        error = 'lease expired',
        lease_expires_at = NULL,
        next_retry_at = CASE WHEN d.outcome = 'retry' THEN now() + make_interval(secs => d.delay_s) END,
        updated_at = now()
    FROM decided d
    WHERE tr.id = d.run_id
    RETURNING tr.id, tr.next_retry_at
)
UPDATE tasks t
SET status = CASE d.outcome WHEN 'retry' THEN 'queued' WHEN 'cancelled' THEN 'cancelled' ELSE 'failed' END,
    retries = t.retries + CASE WHEN d.outcome = 'retry' THEN 1 ELSE 0 END,
    run_at = COALESCE(runs.next_retry_at, t.run_at),
    updated_at = now()
FROM decided d JOIN runs ON runs.id = d.run_id
WHERE t.id = d.task_id
RETURNING t.id, t.name, t.queue, t.priority, t.status, t.run_at, t.limit_keys;

-- name: run_hand_back_by_worker
-- The emergency hand-back of an instance that cannot stop by itself (its event loop is
-- blocked, or a handler thread still runs, past the grace period): every run it still holds goes back to queued without
-- spending a retry, due only after $3 seconds, by which time the process has exited (so no
-- other instance starts a run while this one's handler may still be running for a moment).
-- A task whose cancellation was requested ends cancelled.
WITH runs AS (
    UPDATE task_runs tr
    SET status = CASE WHEN t.cancel_requested_at IS NULL THEN 'retrying' ELSE 'failed' END,
        finished_at = now(), error = $2, lease_expires_at = NULL,
        next_retry_at = CASE WHEN t.cancel_requested_at IS NULL THEN now() + make_interval(secs => $3) END,
        updated_at = now()
    FROM tasks t
    WHERE tr.worker_id = $1 AND tr.status = 'running' AND t.id = tr.task_id
    RETURNING tr.task_id, tr.next_retry_at
)
UPDATE tasks t
SET status = CASE WHEN runs.next_retry_at IS NULL THEN 'cancelled' ELSE 'queued' END,
    run_at = COALESCE(runs.next_retry_at, t.run_at),
    updated_at = now()
FROM runs
WHERE t.id = runs.task_id AND t.status || '' = 'running'  -- by primary key, as in run_finish_many
RETURNING t.id, t.queue, t.priority, t.status, t.run_at, t.limit_keys;

-- name: task_lock_for_cancel
SELECT id, queue, status FROM tasks WHERE id = $1 FOR UPDATE;

-- name: task_cancel_queued
-- A queued (ready, delayed or waiting out a backoff) or blocked (a workflow's, waiting for its deps)
-- task never runs; its queued run, if any, ends failed with error 'cancelled', and so does the
-- pending first run of a task never claimed (written now, so the task keeps a record of why it never ran).
WITH t AS (
    UPDATE tasks SET status = 'cancelled', updated_at = now()
    WHERE id = $1 AND status IN ('queued', 'blocked')
    RETURNING id, queue, priority, status, run_at, limit_keys, attempts, created_at
), queued AS (
    UPDATE task_runs SET status = 'failed', error = 'cancelled', finished_at = now(), updated_at = now()
    WHERE task_id = ANY(ARRAY(SELECT id FROM t)) AND status = 'queued'  -- by (task_id, attempt), not a scan
), pending AS (
    -- (created when the task was, as its pending run showed it)
    INSERT INTO task_runs (id, task_id, attempt, status, error, finished_at, created_at)
    SELECT taskmesh_run_id(id, 1), id, 1, 'failed', 'cancelled', now(), created_at FROM t WHERE attempts = 0
    ON CONFLICT (task_id, attempt) DO NOTHING
)
SELECT id, queue, priority, status, run_at, limit_keys FROM t;

-- name: task_request_cancel
UPDATE tasks SET cancel_requested_at = COALESCE(cancel_requested_at, now()), updated_at = now()
WHERE id = $1 AND status = 'running'
RETURNING id, queue, priority, status, run_at, limit_keys;

-- name: task_list_failed_with_latest_run
-- The dead-letter queue of one queue, oldest first (Postgres is the truth; the
-- Redis list is its mirror), through the failed partial index: every column but the
-- payload (a listing of 1,000 tasks must not carry 1,000 payloads; GET of one task
-- has it), and the latest run's attempt, status, error and end, joined in the same
-- statement by the (task_id, attempt) unique index.
SELECT t.id, t.name, t.type, t.queue, t.priority, t.idempotency_key,
       t.max_retries, t.retries, t.attempts, t.status, t.run_at, t.tenant_id, t.trace_id,
       t.created_at, t.updated_at,
       r.attempt AS run_attempt, r.status AS run_status, r.error AS run_error, r.finished_at AS run_finished_at
FROM tasks t
LEFT JOIN LATERAL (
    SELECT attempt, status, error, finished_at FROM task_runs WHERE task_id = t.id ORDER BY attempt DESC LIMIT 1
) r ON true
WHERE t.queue = $1 AND t.status = 'failed' AND ($3::text IS NULL OR t.tenant_id = $3)
ORDER BY t.updated_at, t.id LIMIT $2;

-- name: task_lock_oldest_failed
-- The ids of up to $2 dead-lettered tasks of queue $1, oldest first, locked until the transaction
-- ends (a replay of the oldest; rows another replay holds are skipped). They are then moved by
-- task_requeue in the same transaction. Only tenant $3's when it is not null.
SELECT id FROM tasks
WHERE queue = $1 AND status = 'failed' AND ($3::text IS NULL OR tenant_id = $3)
ORDER BY updated_at, id
LIMIT $2
FOR UPDATE SKIP LOCKED;

-- name: task_lock_status
-- The task's status and queue, its row locked until the transaction ends (retry, delete).
SELECT status, queue FROM tasks WHERE id = $1 FOR UPDATE;

-- name: task_get_limit_inputs
-- What a task's limit keys are decided by (name, tenant, payload as JSON text) and the keys it holds: a retry
-- into another queue decides them again (limits/book.py LimitBook.keys_moved).
SELECT name, tenant_id, payload::text AS payload, limit_keys FROM tasks WHERE id = $1;

-- name: task_set_limit_keys
-- The limit keys a task holds from now on (NULL: none), decided again as it moved into another queue.
UPDATE tasks SET limit_keys = $2::text[] WHERE id = $1;

-- name: task_delete_one_finished
-- Delete one finished task (completed, failed or cancelled) and, by the foreign key, its runs.
DELETE FROM tasks WHERE id = $1 AND status IN ('completed', 'failed', 'cancelled')
RETURNING status, queue;

-- name: task_requeue
-- Move the tasks of ids $1 whose status is in $2 back to queued (retry one task, replay
-- chosen dead letters, bulk retry and replay): due now, a fresh retry budget, at priority $3 and
-- in queue $4 when they are not null, only those of queue $5 and of tenant $6 when not null; the cancel
-- request of the cycle that ended is forgotten. `attempts` first catches up with the highest
-- run row (a task cancelled while queued has its queued run ended 'cancelled' at attempts + 1),
-- so the next attempt's run is a new, queued row.
WITH upd AS (
    UPDATE tasks t
    SET status = 'queued', retries = 0, priority = COALESCE($3, t.priority), queue = COALESCE($4, t.queue),
        run_at = now(), cancel_requested_at = NULL, updated_at = now(),
        attempts = GREATEST(t.attempts, (SELECT COALESCE(max(r.attempt), 0) FROM task_runs r WHERE r.task_id = t.id))
    WHERE t.id = ANY($1::uuid[]) AND t.status = ANY($2::text[]) AND ($5::text IS NULL OR t.queue = $5)
      AND ($6::text IS NULL OR t.tenant_id = $6)
    RETURNING t.id, t.queue, t.priority, t.attempts, t.limit_keys
), runs AS (
    INSERT INTO task_runs (id, task_id, attempt, status)
    SELECT taskmesh_run_id(id, attempts + 1), id, attempts + 1, 'queued' FROM upd
    ON CONFLICT (task_id, attempt) DO NOTHING
)
SELECT id, queue, priority, limit_keys FROM upd;

-- name: task_list_queued_after
-- Queued tasks of queue $1 after the keyset cursor ($2 run_at, $3 id; null: from the start),
-- unchanged for $4 seconds (0: all), in (run_at, id) order through tasks_queued_key_idx: the
-- reconciler walks a whole backlog page by page, each page an index range scan.
SELECT id, queue, priority, run_at, limit_keys FROM tasks
WHERE status = 'queued' AND queue = $1
  AND (run_at, id) > (COALESCE($2, '-infinity'::timestamptz), COALESCE($3, '00000000-0000-0000-0000-000000000000'::uuid))
  AND updated_at < now() - make_interval(secs => $4)
ORDER BY run_at, id
LIMIT $5;

-- name: task_list_running_limited
-- The running tasks of queue $1 that hold limit keys, with their run's lease end (ms since the epoch):
-- the slots Redis must hold again after it lost them (the reconciler's resync).
SELECT t.id, t.limit_keys, (extract(epoch FROM r.lease_expires_at) * 1000)::bigint AS until_ms
FROM tasks t JOIN task_runs r ON r.id = taskmesh_run_id(t.id, t.attempts)
WHERE t.status = 'running' AND t.queue = $1 AND t.limit_keys IS NOT NULL AND r.status = 'running';

-- name: task_list_failed_ids
-- The ids the DLQ mirror of queue $1 should hold, oldest first, with when each failed (ms since the epoch).
SELECT id, (extract(epoch FROM updated_at) * 1000)::bigint AS failed_at_ms
FROM tasks WHERE queue = $1 AND status = 'failed' ORDER BY updated_at, id LIMIT $2;

-- name: task_count_queued
-- Queued tasks per queue (through the partial index): the reconciler's cheap drift check.
SELECT queue, count(*)::bigint AS n FROM tasks WHERE status = 'queued' AND queue = ANY($1::text[]) GROUP BY queue;

-- Retention: delete up to $2 tasks of one finished status unchanged for $1 seconds (their
-- runs go with them), skipping rows another deleter holds. A workflow's tasks leave with it
-- (workflow_delete_finished), never while it may still read their results. Short statements, so no long
-- lock on a large history. One block per status, the status a literal: with it a parameter,
-- the generic plan that asyncpg's cached statement ends up using cannot match the partial
-- index and scans the whole table (the growth test checks generic plans).
-- (= ANY(ARRAY(...)) makes the delete look its rows up by primary key; an IN
-- subquery may be planned as a hash join over the whole table.)

-- name: task_delete_completed
DELETE FROM tasks WHERE id = ANY(ARRAY(
    SELECT id FROM tasks
    WHERE status = 'completed' AND updated_at < now() - make_interval(secs => $1) AND workflow_id IS NULL
    ORDER BY updated_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
));

-- name: task_delete_cancelled
DELETE FROM tasks WHERE id = ANY(ARRAY(
    SELECT id FROM tasks
    WHERE status = 'cancelled' AND updated_at < now() - make_interval(secs => $1) AND workflow_id IS NULL
    ORDER BY updated_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
));

-- name: task_delete_failed
DELETE FROM tasks WHERE id = ANY(ARRAY(
    SELECT id FROM tasks
    WHERE status = 'failed' AND updated_at < now() - make_interval(secs => $1) AND workflow_id IS NULL
    ORDER BY updated_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
));

-- name: task_status
SELECT status FROM tasks WHERE id = $1;

-- name: task_sample_running_by_queue
-- Metrics sampler: running runs by queue, through the partial index on running runs.
SELECT t.queue, count(*) AS n
  FROM task_runs r JOIN tasks t ON t.id = r.task_id
 WHERE r.status = 'running' AND t.queue = ANY($1::text[])
 GROUP BY t.queue;

-- name: task_sample_failed_by_queue
-- Dead-lettered tasks per queue: the folded count plus the deltas not folded yet (migration 0018).
SELECT queue, sum(n)::bigint AS n FROM (
    SELECT queue, n FROM dead_letter_counts WHERE queue = ANY($1::text[])
    UNION ALL
    SELECT queue, delta FROM dead_letter_deltas WHERE queue = ANY($1::text[])
) counted
GROUP BY queue;

-- name: dead_letter_count_compact
-- Fold up to $1 of the oldest deltas into dead_letter_counts; returns how many it folded. Deltas
-- another compaction holds are skipped; counts rows are locked in queue order (no deadlock).
WITH moved AS (
    DELETE FROM dead_letter_deltas WHERE id = ANY(ARRAY(
        SELECT id FROM dead_letter_deltas ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
    ))
    RETURNING queue, delta
), folded AS (
    INSERT INTO dead_letter_counts AS c (queue, n)
    SELECT queue, sum(delta) FROM moved GROUP BY queue ORDER BY queue
    ON CONFLICT (queue) DO UPDATE SET n = c.n + EXCLUDED.n
)
SELECT count(*)::int FROM moved;

-- name: task_sample_oldest_ready_age
-- Seconds since the oldest queued task of a queue became runnable; 0 when none is due.
-- A run_at of -infinity (a row taskmesh did not write) counts from the task's creation;
-- one of infinity is never due.
SELECT COALESCE(GREATEST(0, extract(epoch FROM now() - (
           SELECT CASE WHEN isfinite(run_at) THEN run_at WHEN run_at < now() THEN created_at ELSE now() END
             FROM tasks WHERE status = 'queued' AND queue = $1 ORDER BY run_at LIMIT 1))), 0)::float8;

-- name: task_count_queued_unserved
-- Queued tasks of every queue not in $1 (the queues live workers serve), at most $2 queues:
-- `queued` all of them, `ready` the due ones. The distinct queues are found by a loose index
-- scan of the queued partial index (one index probe per queue, however long each backlog);
-- only the queues outside $1 are counted, so a served backlog costs nothing.
WITH RECURSIVE queues AS (
    (SELECT queue FROM tasks WHERE status = 'queued' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT t.queue FROM tasks t WHERE t.status = 'queued' AND t.queue > q.queue ORDER BY t.queue LIMIT 1)
    FROM queues q WHERE q.queue IS NOT NULL
)
SELECT q.queue, c.queued, c.ready
FROM queues q
CROSS JOIN LATERAL (
    SELECT count(*)::bigint AS queued, (count(*) FILTER (WHERE t.run_at <= now()))::bigint AS ready
    FROM tasks t WHERE t.status = 'queued' AND t.queue = q.queue
) c
WHERE q.queue IS NOT NULL AND q.queue <> ALL($1::text[])
LIMIT $2;

-- ======================================================================
-- workers
-- ======================================================================

-- name: worker_heartbeat
-- Register or refresh this instance and extend the leases of the runs it holds
-- ($8: ids of runs in its executors, its channels and its committer's hands), in
-- one statement. A running run of this instance that it no longer holds
-- keeps its lease and is reclaimed once that expires. Returns the held runs'
-- tasks whose cancellation was requested, for the instance to cancel.
-- A held run whose row another transaction has locked is skipped, not waited for: that is
-- the committer writing its result, whose statement locks its runs in another order, so
-- waiting made the two deadlock (PostgreSQL then ends one after deadlock_timeout). It is
-- being finished; should that write fail, the next beat, a third of a lease later, extends it.
WITH w AS (
    INSERT INTO workers (id, host, pid, queues, version, state, handlers, handler_options)
    VALUES ($1, $2, $3, $4::text::jsonb, $5, $6, $9::text[], $10::text::jsonb)
    ON CONFLICT (id) DO UPDATE
    SET heartbeat_at = now(), state = EXCLUDED.state, stopped_at = NULL, handlers = EXCLUDED.handlers,
        handler_options = EXCLUDED.handler_options
    RETURNING id
), held AS (
    SELECT id FROM task_runs
    WHERE id = ANY($8::uuid[]) AND worker_id = $1 AND status = 'running'
    FOR UPDATE SKIP LOCKED
), leases AS (
    UPDATE task_runs tr
    SET lease_expires_at = now() + make_interval(secs => $7)
    FROM held WHERE tr.id = held.id
    RETURNING tr.task_id
)
SELECT t.id FROM tasks t JOIN leases l ON l.task_id = t.id
WHERE t.cancel_requested_at IS NOT NULL;

-- name: worker_deregister
UPDATE workers SET state = 'stopped', stopped_at = now(), heartbeat_at = now() WHERE id = $1;

-- name: worker_mark_lost
-- Instances silent for more than $1 seconds are shown as lost.
UPDATE workers SET state = 'lost'
WHERE state IN ('running', 'draining') AND heartbeat_at < now() - make_interval(secs => $1)
RETURNING id;

-- name: worker_delete_old
-- Stopped and lost instances are kept $1 seconds for the record, then forgotten.
DELETE FROM workers
WHERE state IN ('stopped', 'lost') AND heartbeat_at < now() - make_interval(secs => $1);

-- name: worker_list
SELECT w.id, w.host, w.pid, w.queues::text AS queues, w.version, w.started_at, w.heartbeat_at,
       w.stopped_at, w.state,
       (SELECT count(*) FROM task_runs tr WHERE tr.worker_id = w.id AND tr.status = 'running')::int AS in_flight
FROM workers w
ORDER BY (w.state IN ('running', 'draining')) DESC, w.started_at DESC
LIMIT $1;

-- name: worker_sample_by_state
SELECT state, count(*) AS n FROM workers GROUP BY state;

-- name: worker_list_served_handlers
-- Per queue live instances work (at most $1 queues): whether one of them runs any name
-- (handlers NULL: a fallback, or an older version) and the names the others have handlers for.
SELECT q.queue, bool_or(w.handlers IS NULL) AS any_name,
       coalesce(array_agg(DISTINCT h.name) FILTER (WHERE h.name IS NOT NULL), '{}') AS names
FROM workers w
CROSS JOIN LATERAL jsonb_object_keys(w.queues) AS q(queue)
LEFT JOIN LATERAL unnest(w.handlers) AS h(name) ON true
WHERE w.state IN ('running', 'draining')
GROUP BY q.queue
ORDER BY q.queue
LIMIT $1;

-- name: worker_list_advertised_handlers
-- The handlers live instances (running or draining, a heartbeat within $1 seconds) advertise:
-- per task name the options of the most recently started one; plus one row with a NULL name when
-- a live instance runs any name (handlers NULL: a fallback, or an older version). At most $2 rows.
(SELECT DISTINCT ON (h.name) h.name, h.options::text AS options, w.id AS worker_id
 FROM workers w CROSS JOIN LATERAL jsonb_each(w.handler_options) AS h(name, options)
 WHERE w.state IN ('running', 'draining') AND w.heartbeat_at > now() - make_interval(secs => $1)
   AND w.handler_options @> '{}'  -- an object (jsonb_each refuses anything else)
 ORDER BY h.name, w.started_at DESC
 LIMIT $2)
UNION ALL
(SELECT NULL, NULL, w.id FROM workers w
 WHERE w.state IN ('running', 'draining') AND w.heartbeat_at > now() - make_interval(secs => $1)
   AND w.handlers IS NULL
 LIMIT 1);

-- name: worker_list_served_queues
-- The queues live instances (running or draining) work, at most $1 of them.
SELECT DISTINCT q.queue
FROM workers w CROSS JOIN LATERAL jsonb_object_keys(w.queues) AS q(queue)
WHERE w.state IN ('running', 'draining')
ORDER BY q.queue
LIMIT $1;

-- ======================================================================
-- schedules: declared in config, mirrored here, fired by whichever
-- instance locks a due row.
-- ======================================================================

-- name: schedule_upsert
-- A new declaration, or a changed one (its hash differs): reset pause and the next fire.
INSERT INTO schedules AS s (name, cron, timezone, task, queue, priority, payload, max_retries, misfire,
                            misfire_grace_seconds, overlap, enabled, config_hash, next_fire_at, synced_at, tenant_id)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10, $11, $12, $13, $14, $15, $16)
ON CONFLICT (name) DO UPDATE
   SET cron = EXCLUDED.cron, timezone = EXCLUDED.timezone, task = EXCLUDED.task, queue = EXCLUDED.queue,
       priority = EXCLUDED.priority, payload = EXCLUDED.payload, max_retries = EXCLUDED.max_retries,
       misfire = EXCLUDED.misfire, misfire_grace_seconds = EXCLUDED.misfire_grace_seconds,
       overlap = EXCLUDED.overlap, enabled = EXCLUDED.enabled, config_hash = EXCLUDED.config_hash,
       paused = false, next_fire_at = EXCLUDED.next_fire_at, synced_at = EXCLUDED.synced_at,
       tenant_id = EXCLUDED.tenant_id, updated_at = now()
 WHERE s.config_hash IS DISTINCT FROM EXCLUDED.config_hash
RETURNING name;

-- name: schedule_set_queue
-- The effective queue of a declaration (its own, else its handler's, else default), which a
-- handler's new default changes without a change of the declaration (schedules list
-- their queue, never null). Writes nothing when it is already right.
UPDATE schedules SET queue = $2, updated_at = now() WHERE name = $1 AND queue IS DISTINCT FROM $2;

-- name: schedule_touch
UPDATE schedules SET synced_at = $2 WHERE name = ANY($1::text[]);

-- name: schedule_lock_due
SELECT * FROM schedules
 WHERE name = ANY($1::text[]) AND enabled AND NOT paused AND next_fire_at <= $2
 ORDER BY next_fire_at
   FOR UPDATE SKIP LOCKED;

-- name: schedule_due
-- The due rows as schedule_lock_due finds them, without a lock: planned before the fire transaction.
SELECT * FROM schedules
 WHERE name = ANY($1::text[]) AND enabled AND NOT paused AND next_fire_at <= $2
 ORDER BY next_fire_at;

-- name: schedule_advance
UPDATE schedules
   SET last_fire_at = COALESCE($2, last_fire_at), next_fire_at = $3,
       last_task_id = COALESCE($4, last_task_id), updated_at = now()
 WHERE name = $1;

-- name: schedule_next_due
SELECT min(next_fire_at) FROM schedules WHERE name = ANY($1::text[]) AND enabled AND NOT paused;

-- name: schedule_list
SELECT * FROM schedules ORDER BY name;

-- name: schedule_get
SELECT * FROM schedules WHERE name = $1;

-- name: schedule_get_for_update
SELECT * FROM schedules WHERE name = $1 FOR UPDATE;

-- name: schedule_set_paused
-- Pause, or resume with a fresh next fire (fires missed while paused are not misfires).
UPDATE schedules
   SET paused = $2, next_fire_at = CASE WHEN $2 THEN next_fire_at ELSE $3 END, updated_at = now()
 WHERE name = $1
RETURNING *;

-- name: schedule_set_last_task
UPDATE schedules SET last_task_id = $2, updated_at = now() WHERE name = $1;

-- ======================================================================
-- queues: pause and resume, persisted; a queue without a row runs.
-- ======================================================================

-- name: queue_pause
-- Pause a queue (idempotent: a paused queue keeps its first paused_at; a new reason replaces the old).
INSERT INTO queues (name, paused_at, paused_reason) VALUES ($1, now(), $2)
ON CONFLICT (name) DO UPDATE
SET paused_at = COALESCE(queues.paused_at, now()),
    paused_reason = COALESCE(EXCLUDED.paused_reason, queues.paused_reason),
    updated_at = now()
RETURNING name, paused_at, paused_reason;

-- name: queue_resume
UPDATE queues SET paused_at = NULL, paused_reason = NULL, updated_at = now()
WHERE name = $1
RETURNING name, paused_at, paused_reason;

-- name: queue_get_pause
SELECT name, paused_at, paused_reason FROM queues WHERE name = $1;

-- name: queue_list_paused
-- Paused queues by name, at most $1.
SELECT name, paused_at, paused_reason FROM queues WHERE paused_at IS NOT NULL ORDER BY name LIMIT $1;

-- name: queue_minutes_add
-- Add one instance's counts of ended runs, and its wait histograms ($7: each a '{n,n,...}' text,
-- run_tally.WAIT_BOUNDS_SECONDS), to this minute's rows (PostgreSQL's minute).
INSERT INTO queue_minutes AS m (queue, minute, succeeded, retried, failed, cancelled, interrupted, wait_counts)
SELECT q, date_trunc('minute', now()), s, r, f, c, i, w::bigint[]
FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::text[])
    AS u(q, s, r, f, c, i, w)
ON CONFLICT (queue, minute) DO UPDATE
SET succeeded = m.succeeded + EXCLUDED.succeeded, retried = m.retried + EXCLUDED.retried,
    failed = m.failed + EXCLUDED.failed, cancelled = m.cancelled + EXCLUDED.cancelled,
    interrupted = m.interrupted + EXCLUDED.interrupted,
    wait_counts = taskmesh_add_counts(m.wait_counts, EXCLUDED.wait_counts);

-- name: queue_minutes_sample
-- Raise this minute's most ready tasks ($2) and oldest ready age ($3, seconds) of queues $1 to what a sampler saw.
INSERT INTO queue_minutes AS m (queue, minute, ready_max, oldest_ready_max_seconds)
SELECT q, date_trunc('minute', now()), r, o
FROM unnest($1::text[], $2::bigint[], $3::float8[]) AS u(q, r, o)
ON CONFLICT (queue, minute) DO UPDATE
SET ready_max = GREATEST(m.ready_max, EXCLUDED.ready_max),
    oldest_ready_max_seconds = GREATEST(m.oldest_ready_max_seconds, EXCLUDED.oldest_ready_max_seconds);

-- name: queue_minutes_history
-- The last $1 seconds in steps of $2 seconds, oldest first, of queue $3 (NULL: every queue: the runs
-- and waits of queue '*', and the most ready tasks of all queues together: each minute's sum).
-- wait_counts is summed element by element, one term per bucket of run_tally.WAIT_BOUNDS_SECONDS
-- and one for longer waits (21; tests/integration/test_history.py checks the count): plain sums
-- are ten times faster than an aggregate function merging arrays.
WITH span AS (
    SELECT * FROM queue_minutes
    WHERE minute > date_trunc('minute', now()) - make_interval(secs => $1)
      AND ($3::text IS NULL OR queue = $3::text)
), runs AS (
    SELECT date_bin(make_interval(secs => $2), minute, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS step,
           sum(succeeded)::bigint AS succeeded, sum(retried)::bigint AS retried, sum(failed)::bigint AS failed,
           sum(cancelled)::bigint AS cancelled, sum(interrupted)::bigint AS interrupted,
           ARRAY[sum(wait_counts[1]), sum(wait_counts[2]), sum(wait_counts[3]), sum(wait_counts[4]), sum(wait_counts[5]), sum(wait_counts[6]), sum(wait_counts[7]),
                 sum(wait_counts[8]), sum(wait_counts[9]), sum(wait_counts[10]), sum(wait_counts[11]), sum(wait_counts[12]), sum(wait_counts[13]), sum(wait_counts[14]),
                 sum(wait_counts[15]), sum(wait_counts[16]), sum(wait_counts[17]), sum(wait_counts[18]), sum(wait_counts[19]), sum(wait_counts[20]), sum(wait_counts[21])]::bigint[] AS wait_counts
    FROM span
    WHERE queue = coalesce($3::text, '*')
    GROUP BY step
), sampled AS (
    SELECT step, max(ready)::bigint AS ready_max, max(oldest) AS oldest_ready_max_seconds
    FROM (
        SELECT date_bin(make_interval(secs => $2), minute, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS step,
               sum(ready_max) AS ready, max(oldest_ready_max_seconds) AS oldest
        FROM span
        WHERE queue <> '*'
        GROUP BY minute
    ) per_minute
    GROUP BY step
)
SELECT step, coalesce(succeeded, 0) AS succeeded, coalesce(retried, 0) AS retried, coalesce(failed, 0) AS failed,
       coalesce(cancelled, 0) AS cancelled, coalesce(interrupted, 0) AS interrupted,
       coalesce(wait_counts, '{}') AS wait_counts, ready_max, oldest_ready_max_seconds
FROM runs FULL JOIN sampled USING (step)
ORDER BY step;

-- name: queue_minutes_size
-- The rollup's size on disk, its estimated rows (NULL before the table was first analyzed), its oldest
-- minute; the table is found through its own rows' tableoid (0 bytes while it has none).
WITH t AS (SELECT tableoid FROM queue_minutes LIMIT 1)
SELECT coalesce((SELECT pg_total_relation_size(tableoid) FROM t), 0) AS bytes,
       (SELECT CASE WHEN c.reltuples < 0 THEN NULL ELSE c.reltuples::bigint END
        FROM pg_class c JOIN t ON c.oid = t.tableoid) AS rows,
       (SELECT min(minute) FROM queue_minutes) AS since;

-- name: queue_minutes_recent
-- The rows of the last full minute and of the current one so far, of the queues in $1
-- (`current`: whether the row is the current minute's).
SELECT queue, minute, minute = date_trunc('minute', now()) AS current,
       succeeded, retried, failed, cancelled, interrupted
FROM queue_minutes
WHERE queue = ANY($1::text[]) AND minute >= date_trunc('minute', now()) - interval '1 minute';

-- name: queue_minutes_delete_old
-- Retention of the rollup: rows older than $1 seconds, at most $2 of them.
DELETE FROM queue_minutes
WHERE (queue, minute) IN (
    SELECT queue, minute FROM queue_minutes WHERE minute < now() - make_interval(secs => $1) LIMIT $2
);

-- name: queue_list_known
-- Every queue that holds queued, running or dead-lettered tasks, or is paused, by name, at most 1,000
-- (queue_overview.QUEUES_LISTED).
-- Queued and dead-lettered ones by loose index scans of their partial indexes (one probe a queue,
-- however long each backlog); running ones through the running runs (as many as run now).
WITH RECURSIVE queued AS (
    (SELECT queue FROM tasks WHERE status = 'queued' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT t.queue FROM tasks t WHERE t.status = 'queued' AND t.queue > q.queue ORDER BY t.queue LIMIT 1)
    FROM queued q WHERE q.queue IS NOT NULL
), failed AS (
    (SELECT queue FROM tasks WHERE status = 'failed' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT t.queue FROM tasks t WHERE t.status = 'failed' AND t.queue > f.queue ORDER BY t.queue LIMIT 1)
    FROM failed f WHERE f.queue IS NOT NULL
)
SELECT queue FROM (
    SELECT queue FROM queued WHERE queue IS NOT NULL
    UNION SELECT queue FROM failed WHERE queue IS NOT NULL
    UNION SELECT t.queue FROM task_runs r JOIN tasks t ON t.id = r.task_id WHERE r.status = 'running'
    UNION SELECT name FROM queues WHERE paused_at IS NOT NULL
) known
ORDER BY queue LIMIT 1000;

-- name: queue_depths
-- Per queue of $1: tasks waiting out a retry backoff (retrying, through tasks_retrying_idx), running
-- runs, dead-lettered tasks (counted by migration 0018's triggers), and seconds since the oldest
-- due queued task became runnable.
SELECT q.queue,
       (SELECT count(*) FROM tasks t WHERE t.status = 'queued' AND t.retries > 0 AND t.queue = q.queue)::bigint
           AS retrying,
       (SELECT count(*) FROM task_runs r JOIN tasks t ON t.id = r.task_id
         WHERE r.status = 'running' AND t.queue = q.queue)::bigint AS running,
       ((SELECT COALESCE(sum(c.n), 0) FROM dead_letter_counts c WHERE c.queue = q.queue)
        + (SELECT COALESCE(sum(d.delta), 0) FROM dead_letter_deltas d WHERE d.queue = q.queue))::bigint
           AS dead_letter,
       COALESCE(GREATEST(0, extract(epoch FROM now() - (
           SELECT CASE WHEN isfinite(t.run_at) THEN t.run_at WHEN t.run_at < now() THEN t.created_at ELSE now() END
             FROM tasks t WHERE t.status = 'queued' AND t.queue = q.queue ORDER BY t.run_at LIMIT 1))), 0)::float8
           AS oldest_ready_age_seconds
FROM unnest($1::text[]) AS q(queue);

-- ======================================================================
-- bulk operations: the tasks' side of each action, on a batch of ids, each task
-- acted on only from the states the action applies to (the others are counted as skipped),
-- and the operation's own row.
-- ======================================================================

-- name: bulk_cancel
-- Queued tasks become cancelled (their queued or pending run ends failed 'cancelled'); running ones get a
-- cancel request (their worker stops them): their transition rows, status `cancelled` or `running`.
WITH queued AS (
    UPDATE tasks SET status = 'cancelled', updated_at = now()
    WHERE id = ANY($1::uuid[]) AND status || '' IN ('queued', 'blocked')  -- by primary key, not the backlog's index
    RETURNING id, queue, priority, status, run_at, limit_keys, attempts, created_at
), runs AS (
    UPDATE task_runs SET status = 'failed', error = 'cancelled', finished_at = now(), updated_at = now()
    WHERE task_id = ANY(ARRAY(SELECT id FROM queued)) AND status = 'queued'  -- by (task_id, attempt)
), pending AS (
    INSERT INTO task_runs (id, task_id, attempt, status, error, finished_at, created_at)
    SELECT taskmesh_run_id(id, 1), id, 1, 'failed', 'cancelled', now(), created_at FROM queued WHERE attempts = 0
    ON CONFLICT (task_id, attempt) DO NOTHING
), running AS (
    UPDATE tasks SET cancel_requested_at = COALESCE(cancel_requested_at, now()), updated_at = now()
    WHERE id = ANY($1::uuid[]) AND status || '' = 'running'
    RETURNING id, queue, priority, status, run_at, limit_keys
)
SELECT id, queue, priority, status, run_at, limit_keys FROM queued
UNION ALL
SELECT id, queue, priority, status, run_at, limit_keys FROM running;

-- name: bulk_delete
-- Finished tasks (completed, failed, cancelled) are deleted with their runs.
DELETE FROM tasks WHERE id = ANY($1::uuid[]) AND status IN ('completed', 'failed', 'cancelled')
RETURNING id, queue, status;

-- name: operation_insert
INSERT INTO operations (id, action, status, filter, reason, tenant_id, queues)
VALUES ($1, $2, 'running', $3::text::jsonb, $4, $5, $6::text[])
RETURNING *;

-- name: operation_get
SELECT * FROM operations WHERE id = $1;

-- name: operation_take
-- The oldest running operation whose lease is free or expired, leased to $1 for $2 seconds.
UPDATE operations o
SET lease_owner = $1, lease_expires_at = now() + make_interval(secs => $2), updated_at = now()
WHERE o.id = (
    SELECT id FROM operations
    WHERE status = 'running' AND (lease_expires_at IS NULL OR lease_expires_at < now())
    ORDER BY created_at
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
RETURNING o.*;

-- name: operation_advance
-- One batch done: the cursor moves, the counters grow, the lease is extended; nothing when the
-- lease was lost to another instance (then its batch's transaction rolls back).
UPDATE operations
SET cursor_created_at = $3, cursor_id = $4, done = done + $5, skipped = skipped + $6,
    lease_expires_at = now() + make_interval(secs => $7), updated_at = now()
WHERE id = $1 AND lease_owner = $2 AND status = 'running'
RETURNING id;

-- name: operation_finish
UPDATE operations
SET status = $3, error = $4, finished_at = now(), lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
WHERE id = $1 AND lease_owner = $2 AND status = 'running'
RETURNING *;

-- ======================================================================
-- api keys: the hash of each key's secret, its scopes, tenant and queues.
-- ======================================================================

-- name: key_pepper_ensure
-- The deployment's pepper: $1 (random bytes made by the caller) when there is none yet.
WITH made AS (
    INSERT INTO auth_pepper (pepper) VALUES ($1) ON CONFLICT (only_row) DO NOTHING RETURNING pepper
)
SELECT pepper FROM made UNION ALL SELECT pepper FROM auth_pepper LIMIT 1;

-- name: key_pepper
SELECT pepper FROM auth_pepper;

-- name: key_insert
INSERT INTO api_keys (id, name, secret_hash, scopes, tenant_id, queues, expires_at, rate_limits)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::text::jsonb)
RETURNING id, name, scopes, tenant_id, queues, expires_at, revoked_at, created_at, last_used_at, rate_limits::text;

-- name: key_lookup
-- The key of id $1 for a request, with the database's clock (read once per key per cache period).
SELECT id, name, secret_hash, scopes, tenant_id, queues, expires_at, revoked_at, rate_limits::text, now() AS now
FROM api_keys WHERE id = $1;

-- name: key_mark_used
-- A request with key $1 was let through (at most once per key per cache period and instance).
UPDATE api_keys SET last_used_at = now() WHERE id = $1;

-- name: key_any
-- Whether a key was ever made (revoked and expired ones count): an instance on loopback runs
-- open only before the first key, so revoking every key never opens it again.
SELECT EXISTS (SELECT 1 FROM api_keys);

-- name: key_any_active
-- Whether some key can be used: an API for other hosts does not start without one.
SELECT EXISTS (
    SELECT 1 FROM api_keys WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
);

-- name: key_list
SELECT id, name, scopes, tenant_id, queues, expires_at, revoked_at, created_at, last_used_at, rate_limits::text,
       (revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())) AS active
FROM api_keys
ORDER BY created_at DESC, id
LIMIT $1;

-- name: key_get
SELECT id, name, scopes, tenant_id, queues, expires_at, revoked_at, created_at, last_used_at, rate_limits::text
FROM api_keys WHERE id = $1;

-- name: key_revoke
UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())
WHERE id = $1
RETURNING id, name, scopes, tenant_id, queues, expires_at, revoked_at, created_at, last_used_at, rate_limits::text;

-- name: key_expire_at
-- A rotated key keeps working until $2 (the overlap), unless it expires or is revoked sooner.
UPDATE api_keys SET expires_at = least(expires_at, $2)
WHERE id = $1 AND revoked_at IS NULL
RETURNING id, name, scopes, tenant_id, queues, expires_at, revoked_at, created_at, last_used_at, rate_limits::text;

-- ======================================================================
-- audit log: append-only, partitioned by month (migration 0014).
-- ======================================================================

-- name: audit_insert
INSERT INTO audit_events (actor_type, actor_id, actor_name, tenant_id, action, resource_type, resource_id,
                          outcome, status, reason, trace_id, client_addr, user_agent, details)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14::text::jsonb)
RETURNING id, at;

-- name: audit_page
-- Newest first, after the keyset cursor ($1 at, $2 id), with the filters that are not null;
-- a tenant's own events through audit_events_tenant_idx, a key's through audit_events_actor_idx.
SELECT id, at, actor_type, actor_id, actor_name, tenant_id, action, resource_type, resource_id, outcome,
       status, reason, trace_id, client_addr, user_agent, details::text AS details
FROM audit_events
WHERE (at, id) < ($1::timestamptz, $2::bigint)
  AND ($3::text IS NULL OR tenant_id = $3)
  AND ($4::text IS NULL OR actor_id = $4)
  AND ($5::text IS NULL OR action = $5)
  AND ($6::text IS NULL OR outcome = $6)
  AND ($7::text IS NULL OR resource_type = $7)
  AND ($8::text IS NULL OR resource_id = $8)
  AND ($9::timestamptz IS NULL OR at >= $9)
ORDER BY at DESC, id DESC
LIMIT $10;

-- name: audit_partitions
-- Make the months ahead, drop those past retention ($1 days; 0 keeps all).
SELECT taskmesh_audit_partitions($1, $2);

-- name: console_session_insert
-- A console session of key $2 (NULL: an open instance's visitor), valid for $4 seconds.
INSERT INTO console_sessions (id_hash, key_id, csrf_token, expires_at)
VALUES ($1, $2, $3, now() + make_interval(secs => $4))
RETURNING expires_at;

-- name: console_session_lookup
-- The unexpired session whose secret hashes to $1.
SELECT key_id, csrf_token, expires_at FROM console_sessions WHERE id_hash = $1 AND expires_at > now();

-- name: console_session_delete
DELETE FROM console_sessions WHERE id_hash = $1;

-- name: console_session_delete_expired
-- Retention: sessions past their expiry, at most $1 at a time.
DELETE FROM console_sessions
WHERE id_hash IN (SELECT id_hash FROM console_sessions WHERE expires_at <= now() LIMIT $1);
