-- taskmesh: no-transaction
-- Fewer index entries per task. Most tasks have no dedup key, yet every insert and
-- every state change (none of which can be a HOT update: status is indexed) wrote a NULL entry
-- into the dedup index; the new one, tasks_dedup_key_keyed, holds keyed tasks only. The arbiter
-- of ON CONFLICT names the same predicate (task_insert_many), which both indexes satisfy; the
-- contract step 0023 drops tasks_dedup_key, whose ON CONFLICT target (without the predicate)
-- the release before names, and gives the new one its name.
--
-- run_at defaults to now(): a bulk enqueue of immediate tasks copies rows (COPY) without it,
-- so their due time is PostgreSQL's clock, as the INSERT's is.
ALTER TABLE tasks ALTER COLUMN run_at SET DEFAULT now();

-- A concurrent build that failed leaves an invalid index behind: build it again.
DROP INDEX CONCURRENTLY IF EXISTS tasks_dedup_key_keyed;
CREATE UNIQUE INDEX CONCURRENTLY tasks_dedup_key_keyed ON tasks (idempotency_key, (COALESCE(tenant_id, '')))
    WHERE idempotency_key IS NOT NULL;
