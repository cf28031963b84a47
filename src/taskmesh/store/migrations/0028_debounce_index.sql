-- taskmesh: no-transaction
-- The debounce keys of tasks that have not started (queued, never run): one task per key and
-- tenant, which a later create of the key replaces (task_debounce_many's ON CONFLICT). A task that
-- ran once (a retry, a replay) has left it, so it never meets a newer task of its key. Only such
-- tasks are in it: every other write pays the predicate's test only. Built beside a running release.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS tasks_debounce_idx ON tasks (debounce_key, (COALESCE(tenant_id, '')))
    WHERE status = 'queued' AND attempts = 0 AND debounce_key IS NOT NULL;
