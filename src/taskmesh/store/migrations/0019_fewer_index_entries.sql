-- Fewer index entries per task. Most tasks have no dedup key, yet every insert and
-- every state change (none of which can be a HOT update: status is indexed) wrote a NULL entry
-- into the dedup index; now only keyed tasks are in it. The arbiter of ON CONFLICT names the
-- same predicate (task_insert_many).
--
-- run_at defaults to now(): a bulk enqueue of immediate tasks copies rows (COPY) without it,
-- so their due time is PostgreSQL's clock, as the INSERT's is.
ALTER TABLE tasks ALTER COLUMN run_at SET DEFAULT now();

DROP INDEX tasks_dedup_key;
CREATE UNIQUE INDEX tasks_dedup_key ON tasks (idempotency_key, (COALESCE(tenant_id, '')))
    WHERE idempotency_key IS NOT NULL;
