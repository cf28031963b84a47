-- The SQL of workflows (docs/guides/workflows.md), one named block each, called through
-- store/workflow_queries.py. What follows a task's end (releases, skips, maps, a workflow's end)
-- is not here: migration 0025's trigger and taskmesh_workflow_advance do it whatever ends the task.

-- name: workflow_insert
-- The workflow's row; nothing when its dedup key (per tenant) is taken (the unique index decides,
-- also between concurrent submissions: the later one waits for the first to commit).
INSERT INTO workflows (id, name, status, tenant_id, dedup_key, trace_id, context)
VALUES ($1, $2, 'running', $3, $4, $5, $6::text::jsonb)
ON CONFLICT (dedup_key, (COALESCE(tenant_id, ''))) WHERE dedup_key IS NOT NULL DO NOTHING
RETURNING id;

-- name: workflow_find_by_dedup_key
SELECT id, status, trace_id FROM workflows WHERE dedup_key = $1 AND COALESCE(tenant_id, '') = $2;

-- name: workflow_insert_many
-- Many workflows' rows, one per element of the arrays, in their order; a row whose dedup key (per
-- tenant) is taken is not made (the unique index decides, also between concurrent batches: a
-- later one waits for the first to commit). The caller orders keyed rows by (tenant, key), so
-- that two batches sharing keys wait for each other in one order and never deadlock. Returns the
-- ids made.
INSERT INTO workflows (id, name, status, tenant_id, dedup_key, trace_id, context)
SELECT w.id, w.name, 'running', w.tenant_id, w.dedup_key, w.trace_id, w.context::jsonb
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
     WITH ORDINALITY AS w(id, name, tenant_id, dedup_key, trace_id, context, ord)
ORDER BY w.ord
ON CONFLICT (dedup_key, (COALESCE(tenant_id, ''))) WHERE dedup_key IS NOT NULL DO NOTHING
RETURNING id;

-- name: workflow_find_by_dedup_keys
-- The workflows holding these dedup keys ($1 keys, $2 tenants, '' for none; pairwise).
SELECT w.id, w.status, w.trace_id, w.dedup_key, COALESCE(w.tenant_id, '') AS tenant
FROM unnest($1::text[], $2::text[]) AS k(dedup_key, tenant)
JOIN workflows w ON w.dedup_key = k.dedup_key AND COALESCE(w.tenant_id, '') = k.tenant;

-- name: workflow_insert_nodes
-- Every node of a workflow from one JSON array ($2) of rows in workflow_nodes' column names.
INSERT INTO workflow_nodes (workflow_id, node_id, position, kind, task_name, deps, on_dep_failure, map_from,
                            template, status)
SELECT $1, n.node_id, n.position, n.kind, n.task_name, n.deps, n.on_dep_failure, n.map_from, n.template, n.status
FROM jsonb_to_recordset($2::text::jsonb) AS n(node_id text, position integer, kind text, task_name text,
                                             deps text[], on_dep_failure text, map_from text, template jsonb,
                                             status text);

-- name: workflow_insert_edges
INSERT INTO workflow_edges (workflow_id, parent, child)
SELECT $1, e.parent, e.child FROM unnest($2::text[], $3::text[]) AS e(parent, child);

-- name: workflow_insert_nodes_many
-- The nodes of many workflows: $1 their ids, $2 each one's nodes as workflow_insert_nodes' JSON array.
INSERT INTO workflow_nodes (workflow_id, node_id, position, kind, task_name, deps, on_dep_failure, map_from,
                            template, status)
SELECT w.id, n.node_id, n.position, n.kind, n.task_name, n.deps, n.on_dep_failure, n.map_from, n.template, n.status
FROM unnest($1::uuid[], $2::text[]) AS w(id, nodes),
     jsonb_to_recordset(w.nodes::jsonb) AS n(node_id text, position integer, kind text, task_name text,
                                             deps text[], on_dep_failure text, map_from text, template jsonb,
                                             status text);

-- name: workflow_insert_edges_many
-- The edges of many workflows, one per ($1[i] workflow, $2[i] parent, $3[i] child).
INSERT INTO workflow_edges (workflow_id, parent, child)
SELECT e.workflow_id, e.parent, e.child FROM unnest($1::uuid[], $2::text[], $3::text[]) AS e(workflow_id, parent, child);

-- name: workflow_get
SELECT id, name, status, tenant_id, dedup_key, trace_id, context::text AS context, cancel_reason, created_at,
       updated_at, finished_at
FROM workflows WHERE id = $1;

-- name: workflow_nodes
-- Each node of a workflow, with its tasks counted by status and their first start and last end.
SELECT n.node_id, n.kind, n.task_name, n.deps, n.on_dep_failure, n.map_from, n.status, n.error, n.released_at,
       taskmesh_node_state(n.workflow_id, n.node_id, n.status) AS state,
       COALESCE(c.counts, '{}')::text AS counts, c.started_at, c.finished_at, e.error AS task_error
FROM workflow_nodes n
-- why a task of it failed, its latest run's error (a map's first failed item)
LEFT JOIN LATERAL (
    SELECT r.error FROM tasks t JOIN task_runs r ON r.task_id = t.id
    WHERE t.workflow_id = n.workflow_id AND t.workflow_node = n.node_id AND t.status = 'failed'
    ORDER BY t.map_index NULLS FIRST, r.attempt DESC LIMIT 1
) e ON true
LEFT JOIN LATERAL (
    SELECT jsonb_object_agg(s.status, s.n) AS counts, min(s.started_at) AS started_at,
           max(s.finished_at) AS finished_at
    FROM (
        SELECT t.status, count(*) AS n, min(r.started_at) AS started_at, max(r.finished_at) AS finished_at
        FROM tasks t
        LEFT JOIN LATERAL (SELECT min(started_at) AS started_at, max(finished_at) AS finished_at
                           FROM task_runs WHERE task_id = t.id) r ON true
        WHERE t.workflow_id = n.workflow_id AND t.workflow_node = n.node_id
        GROUP BY t.status
    ) s
) c ON true
WHERE n.workflow_id = $1
ORDER BY n.position;

-- name: workflow_task_ids
-- The task ids of each node of a workflow, a map's in item order, at most $2 per node.
SELECT workflow_node, (array_agg(id ORDER BY map_index NULLS FIRST, id))[1:$2] AS ids
FROM tasks WHERE workflow_id = $1
GROUP BY workflow_node;

-- name: workflow_task_map
-- What a submission answered, for workflows already stored ($1): each node (in position order) with
-- its kind and its task ids, a map's in item order, at most $2 per node.
SELECT n.workflow_id, n.node_id, n.kind,
       COALESCE((SELECT (array_agg(t.id ORDER BY t.map_index NULLS FIRST, t.id))[1:$2]
                 FROM tasks t WHERE t.workflow_id = n.workflow_id AND t.workflow_node = n.node_id), '{}') AS ids
FROM workflow_nodes n
WHERE n.workflow_id = ANY($1::uuid[])
ORDER BY n.workflow_id, n.position;

-- name: workflow_page
-- A page of workflows, newest first, after the keyset cursor ($6 created_at, $7 id; null: from the
-- start), filtered by name, status, tenant and a created range; each with its tasks counted by status.
SELECT w.id, w.name, w.status, w.tenant_id, w.dedup_key, w.created_at, w.updated_at, w.finished_at,
       (SELECT COALESCE(jsonb_object_agg(s.status, s.n), '{}')::text
        FROM (SELECT status, count(*) AS n FROM tasks WHERE workflow_id = w.id GROUP BY status) s) AS counts
FROM workflows w
WHERE ($1::text IS NULL OR w.name = $1) AND ($2::text IS NULL OR w.status = $2)
  AND ($3::text IS NULL OR w.tenant_id = $3)
  AND w.created_at >= COALESCE($4::timestamptz, '-infinity') AND w.created_at < COALESCE($5::timestamptz, 'infinity')
  AND (w.created_at, w.id) < (COALESCE($6::timestamptz, 'infinity'),
                              COALESCE($7::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
ORDER BY w.created_at DESC, w.id DESC
LIMIT $8;

-- name: workflow_mark_cancelled
-- Cancel a running workflow: from here no node of it is released (taskmesh_workflow_advance looks at
-- running workflows only), and its blocked nodes are cancelled. Its tasks are ended next
-- (workflow_cancel_tasks), in a statement of their own: this one holds the workflow's row only,
-- so it never waits for a task's row while a task's end waits for it. Returns the status it has.
WITH w AS (
    UPDATE workflows SET status = 'cancelled', cancel_reason = $2, updated_at = now()
    WHERE id = $1 AND status = 'running'
    RETURNING id
), nodes AS (
    UPDATE workflow_nodes SET status = 'cancelled'
    WHERE workflow_id = $1 AND status = 'blocked' AND EXISTS (SELECT 1 FROM w)
)
SELECT COALESCE((SELECT 'cancelled' FROM w), (SELECT status FROM workflows WHERE id = $1)) AS status;

-- name: workflow_cancel_tasks
-- The tasks of a cancelled workflow: blocked and queued ones end cancelled (with the run record of
-- why they never ran, as a cancel of one task writes it); running ones get a cancel request (their
-- instance stops them, a `def` handler's process too). Run again, it finds what is left; of a
-- workflow not cancelled, nothing.
WITH w AS (
    SELECT id FROM workflows WHERE id = $1 AND status = 'cancelled'
), ended AS (
    UPDATE tasks SET status = 'cancelled', updated_at = now()
    WHERE workflow_id = (SELECT id FROM w) AND status IN ('blocked', 'queued')
    RETURNING id, queue, priority, status, run_at, limit_keys, attempts, created_at
), runs AS (
    UPDATE task_runs SET status = 'failed', error = 'cancelled', finished_at = now(), updated_at = now()
    WHERE task_id = ANY(ARRAY(SELECT id FROM ended)) AND status = 'queued'
), pending AS (
    INSERT INTO task_runs (id, task_id, attempt, status, error, finished_at, created_at)
    SELECT taskmesh_run_id(id, 1), id, 1, 'failed', 'cancelled', now(), created_at FROM ended WHERE attempts = 0
    ON CONFLICT (task_id, attempt) DO NOTHING
), running AS (
    UPDATE tasks SET cancel_requested_at = COALESCE(cancel_requested_at, now()), updated_at = now()
    WHERE workflow_id = (SELECT id FROM w) AND status = 'running' AND cancel_requested_at IS NULL
    RETURNING id, queue, priority, status, run_at, limit_keys
)
SELECT id, queue, priority, status, run_at, limit_keys FROM ended
UNION ALL
SELECT id, queue, priority, status, run_at, limit_keys FROM running;

-- name: workflow_advance
-- Decide what can be decided in these workflows now (every blocked node looked at), and end the
-- ones that are over: a retry's releases, a cancel's end, the reconciler's repair. Returns how many
-- nodes it decided.
SELECT taskmesh_workflow_advance($1::uuid[], array_fill(NULL::text, ARRAY[cardinality($1::uuid[])]));

-- name: workflow_status_counts
SELECT status, count(*)::int AS n FROM tasks WHERE workflow_id = $1 GROUP BY status;

-- name: workflow_lock
SELECT status, finished_at FROM workflows WHERE id = $1 FOR NO KEY UPDATE;

-- name: workflow_retry
-- Retry from failure (the workflow's row locked by workflow_lock, and nothing of it running): failed,
-- cancelled and skipped tasks are blocked again with a fresh retry budget (their next run a new
-- attempt), the nodes they belong to and the nodes decided against are blocked again, and the
-- workflow runs; workflow_advance then releases what is ready. Completed tasks keep their results;
-- the callbacks wait again for the workflow's new end (on_failure and finally run once per end).
WITH w AS (
    UPDATE workflows SET status = 'running', finished_at = NULL, cancel_reason = NULL, updated_at = now()
    WHERE id = $1
), reset AS (
    UPDATE tasks t
    SET status = 'blocked', retries = 0, cancel_requested_at = NULL, updated_at = now(),
        attempts = GREATEST(t.attempts, (SELECT COALESCE(max(r.attempt), 0) FROM task_runs r WHERE r.task_id = t.id))
    WHERE t.workflow_id = $1
      AND (t.status IN ('failed', 'cancelled', 'skipped') OR t.workflow_node IN ('on_failure', 'finally'))
    RETURNING t.workflow_node
), nodes AS (
    UPDATE workflow_nodes n SET status = 'blocked', error = NULL, released_at = NULL
    WHERE n.workflow_id = $1
      AND (n.status IN ('skipped', 'failed', 'cancelled') OR n.node_id IN (SELECT workflow_node FROM reset)
           OR n.kind IN ('on_failure', 'finally'))
    RETURNING n.node_id
)
SELECT (SELECT count(*) FROM reset)::int AS tasks, (SELECT count(*) FROM nodes)::int AS nodes;

-- name: workflow_find_stuck
-- Workflows a lost or missed decision left behind (the reconciler's repair): a running one with a
-- blocked node that taskmesh_workflow_advance would decide now (by its policy: `fail` once a dep
-- failed or none is pending, `ignore` once every dep ended, `continue` once a dep failed or every
-- dep ended; a callback once every other node ended), or one whose every task ended and node was
-- decided but that is not over; a cancelled one with a task still blocked, queued, or running
-- without a cancel request. At most $1, the longest untouched first. Only a decision no
-- transaction took can be seen here: a task's end and the decisions it allows commit together.
SELECT id FROM (
    SELECT w.id, w.updated_at FROM workflows w
    JOIN workflow_nodes n ON n.workflow_id = w.id AND n.status = 'blocked'
    CROSS JOIN LATERAL (
        SELECT COALESCE(bool_or(x.s = 'pending'), false) AS pending,
               COALESCE(bool_or(x.s = 'failing'), false) AS failing,
               COALESCE(bool_or(x.s = 'failed'), false) AS failed
        FROM (SELECT taskmesh_node_state(d.workflow_id, d.node_id, d.status) AS s
              FROM workflow_nodes d
              WHERE d.workflow_id = n.workflow_id
                AND (d.node_id = ANY(n.deps)
                     OR n.kind IN ('on_failure', 'finally') AND d.kind IN ('task', 'map')
                     OR n.kind = 'finally' AND d.kind = 'on_failure')) x
    ) st
    WHERE w.status = 'running'
      AND CASE WHEN n.kind IN ('on_failure', 'finally') OR n.on_dep_failure = 'ignore'
                   THEN NOT (st.pending OR st.failing)
               ELSE st.failed OR st.failing OR NOT st.pending END
    UNION ALL
    SELECT w.id, w.updated_at FROM workflows w
    WHERE w.finished_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM workflow_nodes n WHERE n.workflow_id = w.id AND n.status = 'blocked')
      AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.workflow_id = w.id AND t.status IN ('blocked', 'queued', 'running'))
    UNION ALL
    SELECT w.id, w.updated_at FROM workflows w
    WHERE w.status = 'cancelled' AND w.finished_at IS NULL
      AND EXISTS (SELECT 1 FROM tasks t WHERE t.workflow_id = w.id
                    AND (t.status IN ('blocked', 'queued') OR t.status = 'running' AND t.cancel_requested_at IS NULL))
) stuck
GROUP BY id ORDER BY min(updated_at) LIMIT $1;

-- name: workflow_run_inputs
-- What the claimed tasks of workflows ($1 workflow, $2 node, one pair per task) are handed: each
-- dep's tasks with their status and latest successful result, a map's in item order. A map over a
-- result is not handed that result: each of its tasks holds its own item as its payload, and the
-- whole list, handed to each of thousands of tasks, is what workflow_parents_max_bytes bounds.
SELECT c.workflow_id, c.node, e.parent, p.kind, t.map_index, t.status, r.result::text AS result
FROM (SELECT DISTINCT * FROM unnest($1::uuid[], $2::text[]) AS c(workflow_id, node)) c
JOIN workflow_nodes cn ON cn.workflow_id = c.workflow_id AND cn.node_id = c.node
JOIN workflow_edges e ON e.workflow_id = c.workflow_id AND e.child = c.node
                     AND e.parent IS DISTINCT FROM cn.map_from
JOIN workflow_nodes p ON p.workflow_id = e.workflow_id AND p.node_id = e.parent
LEFT JOIN tasks t ON t.workflow_id = e.workflow_id AND t.workflow_node = e.parent
LEFT JOIN LATERAL (
    SELECT result FROM task_runs WHERE task_id = t.id AND status = 'succeeded' ORDER BY attempt DESC LIMIT 1
) r ON true
ORDER BY c.workflow_id, c.node, e.parent, t.map_index;

-- name: workflow_run_context
-- The workflows of claimed tasks ($1); each node's state, the callbacks' summary, only of those in $2
-- (the workflows of claimed callbacks: every other claim skips reading every node's state).
SELECT w.id, w.name, w.context::text AS context,
       CASE WHEN w.id = ANY($2::uuid[]) THEN
       (SELECT jsonb_object_agg(n.node_id, CASE WHEN n.status IN ('skipped', 'cancelled') THEN n.status
                                                ELSE taskmesh_node_state(n.workflow_id, n.node_id, n.status) END)
        FROM workflow_nodes n WHERE n.workflow_id = w.id AND n.kind IN ('task', 'map'))::text END AS summary
FROM workflows w WHERE w.id = ANY($1::uuid[]);

-- name: workflow_owner
-- Whose a workflow is: its tenant and its nodes' queues, for a key bound to a tenant or queues.
SELECT w.tenant_id, ARRAY(SELECT DISTINCT n.template ->> 'queue' FROM workflow_nodes n WHERE n.workflow_id = w.id)
    AS queues
FROM workflows w WHERE w.id = $1;

-- name: workflow_delete_finished
-- Retention: up to $2 workflows over for $1 seconds leave with their tasks (and, by the foreign
-- keys, their runs, nodes and edges), rows another deleter holds skipped.
WITH gone AS (
    DELETE FROM workflows WHERE id = ANY(ARRAY(
        SELECT id FROM workflows
        WHERE finished_at < now() - make_interval(secs => $1)
        ORDER BY finished_at LIMIT $2 FOR UPDATE SKIP LOCKED
    ))
    RETURNING id
), tasks_gone AS (
    DELETE FROM tasks WHERE workflow_id = ANY(ARRAY(SELECT id FROM gone))
)
SELECT count(*)::int FROM gone;

-- name: workflow_take_ended
-- Up to $1 ended workflows not counted yet, taken (deleted) for this instance's metrics.
DELETE FROM workflow_ended WHERE id = ANY(ARRAY(
    SELECT id FROM workflow_ended ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
))
RETURNING name, outcome, seconds;
