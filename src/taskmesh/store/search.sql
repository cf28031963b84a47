-- The task search. search_queries.py builds one statement per window key and order
-- from these templates: {key} is the window's indexed condition on $1 (queue, name, tenant_id,
-- idempotency_key, payload containment, or none) and {source} the table whose index it ranges
-- over (task_search for the keys that never change, migration 0020; tasks for the others),
-- {cmp}/{dir}/{rev} the keyset's direction.
--
-- A page reads a window of at most $6 rows of the key's index in (created_at, id) order after
-- the cursor ($4, $5) and within (created_at_after $2, created_at_before $3), then keeps those
-- matching the other filters: a page costs at most the window, whatever the history.

-- name: search_page
WITH win AS (
    SELECT id, created_at FROM {source}
    WHERE {key} AND created_at > $2 AND created_at < $3 AND (created_at, id) {cmp} ($4::timestamptz, $5::uuid)
    ORDER BY created_at {dir}, id {dir}
    LIMIT $6
)
SELECT t.id, t.name, t.type, t.queue, t.priority, t.idempotency_key,
       t.max_retries, t.retries, t.attempts, t.status, t.run_at, t.tenant_id, t.trace_id,
       t.created_at, t.updated_at,
       r.attempt AS run_attempt, r.status AS run_status, r.error AS run_error, r.finished_at AS run_finished_at
FROM win w
JOIN tasks t ON t.id = w.id
LEFT JOIN LATERAL (
    SELECT * FROM (
        (SELECT attempt, status, error, finished_at, 0 AS pending
           FROM task_runs WHERE task_id = t.id ORDER BY attempt DESC LIMIT 1)
        UNION ALL
        -- a task not claimed yet shows its pending first run (migration 0017)
        SELECT 1, 'queued', NULL, NULL, 1 WHERE t.status = 'queued' AND t.attempts = 0
    ) runs ORDER BY attempt DESC, pending LIMIT 1
) r ON true
WHERE (cardinality($7::text[]) = 0 OR t.status = ANY($7::text[]))
  AND ($8::text IS NULL OR t.queue = $8)
  AND ($9::text IS NULL OR t.name = $9)
  AND ($10::text IS NULL OR t.tenant_id = $10)
  AND ($11::text IS NULL OR strpos(lower(r.error), lower($11)) > 0)
  AND ($12::timestamptz IS NULL OR (t.status IN ('completed', 'failed', 'cancelled') AND t.updated_at > $12))
  AND ($13::timestamptz IS NULL OR (t.status IN ('completed', 'failed', 'cancelled') AND t.updated_at < $13))
  AND ($14::text[] IS NULL OR t.queue = ANY($14::text[]))
ORDER BY w.created_at {dir}, w.id {dir}
LIMIT $15;

-- name: search_window_end
-- How many rows the window held, and its last one (where the next page starts).
WITH win AS (
    SELECT id, created_at FROM {source}
    WHERE {key} AND created_at > $2 AND created_at < $3 AND (created_at, id) {cmp} ($4::timestamptz, $5::uuid)
    ORDER BY created_at {dir}, id {dir}
    LIMIT $6
)
SELECT created_at, id, (SELECT count(*) FROM win)::int AS scanned
FROM win ORDER BY created_at {rev}, id {rev} LIMIT 1;
