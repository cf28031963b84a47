-- Workflows: a graph of tasks (docs/guides/workflows.md). Nodes are task rows (a map node one per
-- item) tagged with their workflow and node; the graph's shape is in workflow_nodes and
-- workflow_edges. A task waiting for its deps is `blocked` (the claim, the reconciler's push and
-- the queue depths look at `queued` only); a task a failed dep will never let run is `skipped`.
--
-- Readiness is decided in PostgreSQL, in the transaction that ends a task, whatever statement
-- ends it: one statement-level trigger on tasks (tasks_transitions) hands every task of a
-- workflow that reached a terminal state to taskmesh_workflow_advance, which releases each
-- child whose deps are now all terminal with a conditional update from `blocked`, skips the
-- descendants a failure dooms, expands a map over its source's result, and ends the workflow.
-- Released ids reach Redis by the path of a transactional enqueue: a notification on
-- taskmesh_enqueued, delivered at commit (enqueued_listener pushes them; the reconciler finds
-- any it missed), so no follow-up is needed from the statement that ended the task.
--
-- Expand step: new tables, nullable columns (no rewrite), a wider CHECK (NOT VALID here,
-- validated and the narrower one dropped in 0026 beside the indexes built concurrently).
CREATE TABLE workflows (
    id          uuid PRIMARY KEY,
    name        text NOT NULL,
    status      text NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'cancelled')),
    tenant_id   text,
    dedup_key   text,
    trace_id    text,
    context     jsonb,
    cancel_reason text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE UNIQUE INDEX workflows_dedup_key ON workflows (dedup_key, (COALESCE(tenant_id, ''))) WHERE dedup_key IS NOT NULL;
CREATE INDEX workflows_created_idx ON workflows (created_at, id);
CREATE INDEX workflows_finished_idx ON workflows (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX workflows_running_idx ON workflows (updated_at) WHERE status = 'running';

-- One row per node. kind: a task, a map (one task per item), or a callback run when the
-- workflow fails (on_failure) or ends (finally). status: blocked until decided, then released
-- (its tasks exist and are not blocked), skipped (a failed dep under on_dep_failure 'fail'),
-- failed (a map whose source's result is not a list) or cancelled (the workflow was).
CREATE TABLE workflow_nodes (
    workflow_id    uuid NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    node_id        text NOT NULL,
    position       integer NOT NULL,
    kind           text NOT NULL CHECK (kind IN ('task', 'map', 'on_failure', 'finally')),
    task_name      text NOT NULL,
    deps           text[] NOT NULL DEFAULT '{}',
    on_dep_failure text NOT NULL CHECK (on_dep_failure IN ('fail', 'ignore', 'continue')),
    map_from       text,
    template       jsonb NOT NULL,  -- queue, priority, max_retries, timeout, max_items of tasks made at release
    status         text NOT NULL CHECK (status IN ('blocked', 'released', 'skipped', 'failed', 'cancelled')),
    error          text,
    released_at    timestamptz,
    PRIMARY KEY (workflow_id, node_id)
);
CREATE INDEX workflow_nodes_blocked_idx ON workflow_nodes (workflow_id) WHERE status = 'blocked';

CREATE TABLE workflow_edges (
    workflow_id uuid NOT NULL,
    parent      text NOT NULL,
    child       text NOT NULL,
    PRIMARY KEY (workflow_id, parent, child),
    FOREIGN KEY (workflow_id, child) REFERENCES workflow_nodes (workflow_id, node_id) ON DELETE CASCADE
);
CREATE INDEX workflow_edges_child_idx ON workflow_edges (workflow_id, child);  -- a node's deps, at claim

-- Workflows that ended, until an instance's sampler counts them (taskmesh_workflows_ended_total): each
-- row is taken by one instance (DELETE ... RETURNING), so the sum over instances counts each once.
CREATE TABLE workflow_ended (
    id      bigserial PRIMARY KEY,
    name    text NOT NULL,
    outcome text NOT NULL,
    seconds float8 NOT NULL
);

ALTER TABLE tasks ADD COLUMN IF NOT EXISTS workflow_id uuid,
                  ADD COLUMN IF NOT EXISTS workflow_node text,
                  ADD COLUMN IF NOT EXISTS map_index integer,
                  ADD COLUMN IF NOT EXISTS timeout_s float8 CHECK (timeout_s > 0);
ALTER TABLE tasks ADD CONSTRAINT tasks_status_valid
    CHECK (status IN ('blocked', 'queued', 'running', 'completed', 'failed', 'cancelled', 'skipped')) NOT VALID;

-- A time-ordered (version 7) uuid made in SQL, for the tasks a map creates at release: new
-- rows land at the primary key's right edge, as the ones taskmesh.ids.uuid7 makes.
CREATE FUNCTION taskmesh_uuid7() RETURNS uuid
LANGUAGE sql VOLATILE AS $$
    SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid()) PLACING
        substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3) FROM 1 FOR 6),
        52, 1), 53, 1), 'hex')::uuid
$$;

-- Where a node stands, from its tasks' rows (no counter is kept anywhere): pending (blocked, or
-- a task of it not ended), failing (a task of it failed while others still run), failed (ended,
-- not every task completed; skipped, failed or cancelled as a node) or succeeded.
-- PL/pgSQL, not SQL: a SQL function with several statements-worth of EXISTS is not inlined and
-- was planned again on every call (0.9 ms each, most of a chain's end); PL/pgSQL keeps its plans.
CREATE FUNCTION taskmesh_node_state(p_workflow uuid, p_node text, p_status text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_status = 'blocked' THEN
        RETURN 'pending';
    ELSIF p_status <> 'released' THEN
        RETURN 'failed';
    END IF;
    IF EXISTS (SELECT 1 FROM tasks WHERE workflow_id = p_workflow AND workflow_node = p_node
                                     AND status IN ('failed', 'cancelled', 'skipped')) THEN
        IF EXISTS (SELECT 1 FROM tasks WHERE workflow_id = p_workflow AND workflow_node = p_node
                                         AND status IN ('blocked', 'queued', 'running')) THEN
            RETURN 'failing';
        END IF;
        RETURN 'failed';
    ELSIF EXISTS (SELECT 1 FROM tasks WHERE workflow_id = p_workflow AND workflow_node = p_node
                                        AND status IN ('blocked', 'queued', 'running')) THEN
        RETURN 'pending';
    END IF;
    RETURN 'succeeded';
END
$$;

-- Decide what the ends of tasks of nodes (p_workflows[i], p_nodes[i]) make possible; a null node:
-- look at every blocked node of that workflow (the reconciler's repair, a retry). Returns how
-- many nodes it decided (released, skipped or failed).
--
-- One decision at a time per workflow: the row lock below is taken by every path that comes here
-- (the trigger, a retry, the reconciler), and each statement after it reads a fresh snapshot
-- (READ COMMITTED), so the last of two concurrent ends sees the other's and releases the join,
-- and the conditional update from `blocked` releases it once.
--
-- Set-based: one statement decides every candidate of the batch, one skips, one releases; only a
-- map over a result is made node by node. A batch of results ends tasks of hundreds of
-- workflows at once, and a statement per candidate cost more than the candidate's own work.
-- Nodes decided in one round whose children (or callbacks) may now be decided are the next
-- round's frontier: a skip, a map that failed, a node released with no task to run.
CREATE FUNCTION taskmesh_workflow_advance(p_workflows uuid[], p_nodes text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_w uuid[] := p_workflows;
    v_n text[] := p_nodes;
    v_next_w uuid[];
    v_next_n text[];
    v_all uuid[];
    v_running uuid[];
    v_released uuid[] := '{}';
    v_ids uuid[];
    v_decided integer := 0;
    v_skip_w uuid[];
    v_skip_n text[];
    v_rel_w uuid[];
    v_rel_n text[];
    v_made_w uuid[];
    v_made_n text[];
    v_result jsonb;
    v_error text;
    c record;
BEGIN
    SELECT array_agg(id ORDER BY id), array_agg(id) FILTER (WHERE status = 'running') INTO v_all, v_running FROM (
        SELECT id, status FROM workflows WHERE id = ANY(p_workflows) ORDER BY id FOR NO KEY UPDATE
    ) locked;
    IF v_all IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM set_config('taskmesh.advancing', 'on', true);
    LOOP
        -- Every candidate's verdict from its deps' states (a callback's: every task and map node's).
        SELECT array_agg(v.workflow_id) FILTER (WHERE v.verdict = 'skip'),
               array_agg(v.node_id) FILTER (WHERE v.verdict = 'skip'),
               array_agg(v.workflow_id) FILTER (WHERE v.verdict = 'release'),
               array_agg(v.node_id) FILTER (WHERE v.verdict = 'release')
        INTO v_skip_w, v_skip_n, v_rel_w, v_rel_n
        FROM (
            SELECT n.workflow_id, n.node_id,
                   CASE WHEN n.kind IN ('task', 'map') THEN
                       CASE WHEN n.on_dep_failure = 'fail' AND st.bad THEN 'skip'
                            WHEN n.on_dep_failure = 'continue' AND st.bad THEN 'release'  -- at the first failure
                            WHEN st.pending OR n.on_dep_failure = 'ignore' AND st.failing THEN 'wait'
                            ELSE 'release' END
                   WHEN st.pending OR st.failing THEN 'wait'
                   WHEN n.kind = 'finally' THEN 'release'
                   WHEN EXISTS (SELECT 1 FROM workflow_nodes d WHERE d.workflow_id = n.workflow_id
                                   AND d.kind IN ('task', 'map') AND d.status IN ('skipped', 'failed', 'cancelled'))
                     OR EXISTS (SELECT 1 FROM tasks t JOIN workflow_nodes d
                                  ON d.workflow_id = t.workflow_id AND d.node_id = t.workflow_node
                                WHERE t.workflow_id = n.workflow_id AND d.kind IN ('task', 'map')
                                  AND t.status IN ('failed', 'cancelled', 'skipped')) THEN 'release'
                   ELSE 'skip' END AS verdict
            -- The candidates, driven by the frontier: its nodes' children, its workflows' callbacks,
            -- every blocked node of a workflow named without a node.
            FROM (SELECT e.workflow_id AS w, e.child AS node
                  FROM unnest(v_w, v_n) ch(w, node) JOIN workflow_edges e ON e.workflow_id = ch.w AND e.parent = ch.node
                  UNION
                  SELECT b.workflow_id, b.node_id FROM workflow_nodes b
                  WHERE b.workflow_id = ANY(v_w) AND b.status = 'blocked' AND b.kind IN ('on_failure', 'finally')
                  UNION
                  SELECT b.workflow_id, b.node_id FROM workflow_nodes b
                  WHERE b.status = 'blocked'
                    AND b.workflow_id IN (SELECT ch.w FROM unnest(v_w, v_n) ch(w, node) WHERE ch.node IS NULL)) cand
            JOIN workflow_nodes n ON n.workflow_id = cand.w AND n.node_id = cand.node
            -- Each dep's state as taskmesh_node_state says it, inline (a function call per dep cost
            -- more than its probes): open = blocked, or released with a task not ended; bad = decided
            -- other than released, or released with a task that ended badly. failing = bad and open.
            CROSS JOIN LATERAL (
                SELECT COALESCE(bool_or(x.bad), false) AS bad,
                       COALESCE(bool_or(x.bad AND x.open), false) AS failing,
                       COALESCE(bool_or(x.open AND NOT x.bad), false) AS pending
                FROM (SELECT d.status = 'blocked'
                             OR d.status = 'released' AND EXISTS (
                                 SELECT 1 FROM tasks t WHERE t.workflow_id = d.workflow_id AND t.workflow_node = d.node_id
                                   AND t.status IN ('blocked', 'queued', 'running')) AS open,
                             d.status NOT IN ('blocked', 'released')
                             OR d.status = 'released' AND EXISTS (
                                 SELECT 1 FROM tasks t WHERE t.workflow_id = d.workflow_id AND t.workflow_node = d.node_id
                                   AND t.status IN ('failed', 'cancelled', 'skipped')) AS bad
                      FROM workflow_nodes d
                      WHERE d.workflow_id = n.workflow_id
                        AND CASE WHEN n.kind IN ('task', 'map') THEN d.node_id = ANY(n.deps)
                                 ELSE d.kind IN ('task', 'map') OR n.kind = 'finally' AND d.kind = 'on_failure' END) x
            ) st
            WHERE n.status = 'blocked' AND n.workflow_id = ANY(v_running)
        ) v;
        v_next_w := COALESCE(v_skip_w, '{}');
        v_next_n := COALESCE(v_skip_n, '{}');
        v_decided := v_decided + cardinality(v_next_w) + COALESCE(cardinality(v_rel_w), 0);

        IF v_skip_w IS NOT NULL THEN
            UPDATE workflow_nodes n SET status = 'skipped'
            FROM unnest(v_skip_w, v_skip_n) s(w, node)
            WHERE n.workflow_id = s.w AND n.node_id = s.node AND n.status = 'blocked';
            UPDATE tasks t SET status = 'skipped', updated_at = now()
            FROM unnest(v_skip_w, v_skip_n) s(w, node)
            WHERE t.workflow_id = s.w AND t.workflow_node = s.node AND t.status = 'blocked';
        END IF;

        IF v_rel_w IS NOT NULL THEN
            -- A map over a result is made when released; released again by a retry, it keeps its tasks.
            v_made_w := '{}';
            v_made_n := '{}';
            FOR c IN
                SELECT n.workflow_id, n.node_id, n.task_name, n.map_from, n.template
                FROM workflow_nodes n JOIN unnest(v_rel_w, v_rel_n) r(w, node)
                  ON n.workflow_id = r.w AND n.node_id = r.node
                WHERE n.map_from IS NOT NULL
                  AND NOT EXISTS (SELECT 1 FROM tasks WHERE workflow_id = n.workflow_id AND workflow_node = n.node_id)
                ORDER BY n.workflow_id, n.position
            LOOP
                v_error := NULL;
                SELECT r.result INTO v_result FROM tasks t JOIN task_runs r ON r.task_id = t.id
                WHERE t.workflow_id = c.workflow_id AND t.workflow_node = c.map_from AND t.status = 'completed'
                  AND r.status = 'succeeded'
                ORDER BY r.attempt DESC LIMIT 1;
                IF NOT FOUND THEN
                    v_error := format('map.from: node %L did not succeed, so there is no list to map over', c.map_from);
                ELSIF v_result IS NULL OR jsonb_typeof(v_result) <> 'array' THEN
                    v_error := format('map.from: node %L returned %s, not a list', c.map_from,
                                      COALESCE(jsonb_typeof(v_result), 'nothing'));
                ELSIF jsonb_array_length(v_result) > (c.template ->> 'max_items')::integer THEN
                    v_error := format('map.from: node %L returned %s items, more than the workflow_map_max_items setting (%s)',
                                      c.map_from, jsonb_array_length(v_result), c.template ->> 'max_items');
                END IF;
                IF v_error IS NOT NULL THEN
                    UPDATE workflow_nodes SET status = 'failed', error = v_error
                    WHERE workflow_id = c.workflow_id AND node_id = c.node_id;
                    v_next_w := v_next_w || c.workflow_id;
                    v_next_n := v_next_n || c.node_id;
                    CONTINUE;
                END IF;
                WITH made AS (
                    INSERT INTO tasks (id, name, type, queue, priority, payload, max_retries, status, run_at,
                                       tenant_id, trace_id, workflow_id, workflow_node, map_index, timeout_s,
                                       limit_keys)
                    SELECT taskmesh_uuid7(), c.task_name, 'immediate', c.template ->> 'queue',
                           (c.template ->> 'priority')::integer, item.value, (c.template ->> 'max_retries')::integer,
                           'queued', now(), w.tenant_id, w.trace_id, c.workflow_id, c.node_id,
                           (item.ordinality - 1)::integer, (c.template ->> 'timeout')::float8,
                           -- the node's limit keys (limits/book.py; 0027 adds the column)
                           CASE WHEN c.template ? 'limit_keys'
                                THEN ARRAY(SELECT jsonb_array_elements_text(c.template -> 'limit_keys')) END
                    FROM jsonb_array_elements(v_result) WITH ORDINALITY AS item(value, ordinality)
                    JOIN workflows w ON w.id = c.workflow_id
                    ORDER BY item.ordinality
                    RETURNING id
                )
                SELECT array_agg(id) INTO v_ids FROM made;
                IF v_ids IS NULL THEN  -- a map over an empty list has ended as it began
                    v_next_w := v_next_w || c.workflow_id;
                    v_next_n := v_next_n || c.node_id;
                ELSE
                    v_released := v_released || v_ids;
                    v_made_w := v_made_w || c.workflow_id;
                    v_made_n := v_made_n || c.node_id;
                END IF;
            END LOOP;

            -- Every other released node's tasks, blocked until now, in one statement; a node with
            -- none (a map over an empty list) has ended as it began.
            WITH released AS (
                UPDATE tasks t SET status = 'queued', run_at = now(), updated_at = now()
                FROM unnest(v_rel_w, v_rel_n) r(w, node)
                WHERE t.workflow_id = r.w AND t.workflow_node = r.node AND t.status = 'blocked'
                RETURNING t.id, t.workflow_id, t.workflow_node
            ), empty AS (
                SELECT r.w, r.node FROM unnest(v_rel_w, v_rel_n) r(w, node)
                WHERE NOT EXISTS (SELECT 1 FROM released x WHERE x.workflow_id = r.w AND x.workflow_node = r.node)
                  AND NOT EXISTS (SELECT 1 FROM unnest(v_made_w, v_made_n) m(w, node) WHERE m.w = r.w AND m.node = r.node)
                  AND NOT EXISTS (SELECT 1 FROM unnest(v_next_w, v_next_n) f(w, node) WHERE f.w = r.w AND f.node = r.node)
            )
            SELECT (SELECT array_agg(id) FROM released), v_next_w || (SELECT array_agg(w) FROM empty),
                   v_next_n || (SELECT array_agg(node) FROM empty)
            INTO v_ids, v_next_w, v_next_n;
            v_released := v_released || COALESCE(v_ids, '{}');

            UPDATE workflow_nodes n SET status = 'released', released_at = now()
            FROM unnest(v_rel_w, v_rel_n) r(w, node)
            WHERE n.workflow_id = r.w AND n.node_id = r.node AND n.status = 'blocked';
        END IF;
        EXIT WHEN cardinality(v_next_w) = 0;
        v_w := v_next_w;
        v_n := v_next_n;
    END LOOP;

    -- A workflow whose every node is decided and every task ended is over (and counted: workflow_ended).
    -- Then a task or map node succeeded exactly when it was released and no task of it ended badly,
    -- so it failed when such a node was not released or a task of it ended badly (a callback's
    -- skipped task is no failure: an on_failure is skipped when nothing failed).
    WITH over AS (
    UPDATE workflows w
    SET status = CASE
            WHEN w.status <> 'running' THEN w.status
            WHEN EXISTS (SELECT 1 FROM workflow_nodes d WHERE d.workflow_id = w.id AND d.kind IN ('task', 'map')
                            AND d.status <> 'released')
              OR EXISTS (SELECT 1 FROM tasks t WHERE t.workflow_id = w.id
                            AND (t.status IN ('failed', 'cancelled')
                                 OR t.status = 'skipped' AND t.workflow_node NOT IN ('on_failure', 'finally')))
                THEN 'failed'
            ELSE 'completed' END,
        finished_at = now(), updated_at = now()
    WHERE w.id = ANY(v_all) AND w.finished_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.workflow_id = w.id AND t.status IN ('blocked', 'queued', 'running'))
      AND NOT EXISTS (SELECT 1 FROM workflow_nodes d WHERE d.workflow_id = w.id AND d.status = 'blocked')
    RETURNING w.name, w.status, extract(epoch FROM w.finished_at - w.created_at)::float8 AS seconds
    )
    INSERT INTO workflow_ended (name, outcome, seconds) SELECT name, status, seconds FROM over;

    PERFORM set_config('taskmesh.advancing', 'off', true);
    FOR i IN 1 .. cardinality(v_released) BY 200 LOOP
        PERFORM pg_notify('taskmesh_enqueued', array_to_string(v_released[i : i + 199], ' '));
    END LOOP;
    RETURN v_decided;
END
$$;

-- The one place a task's status change is followed up, whatever statement made it (a result,
-- a reclaim, a hand-back, a cancel, a bulk operation, a retry): the tasks of workflows that
-- are in a terminal state after the statement advance their workflows. Other statements pay one
-- scan of their transition table for a workflow id. Only the new rows are kept (keeping the old
-- ones too, to see which statuses changed, cost every update of tasks a second copy of its rows):
-- a statement that rewrites a task already ended advances its workflow again, which decides
-- nothing new. The updates advance makes itself are looked at by advance's own loop, not by a
-- nested call (taskmesh.advancing).
CREATE FUNCTION taskmesh_task_transitions() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_w uuid[];
    v_n text[];
BEGIN
    IF current_setting('taskmesh.advancing', true) = 'on' THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(e.workflow_id), array_agg(e.workflow_node) INTO v_w, v_n
    FROM (SELECT DISTINCT n.workflow_id, n.workflow_node FROM changed_new n
          WHERE n.workflow_id IS NOT NULL AND n.status IN ('completed', 'failed', 'cancelled', 'skipped')) e;
    IF v_w IS NOT NULL THEN
        PERFORM taskmesh_workflow_advance(v_w, v_n);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER tasks_transitions AFTER UPDATE ON tasks
    REFERENCING NEW TABLE AS changed_new
    FOR EACH STATEMENT EXECUTE FUNCTION taskmesh_task_transitions();
