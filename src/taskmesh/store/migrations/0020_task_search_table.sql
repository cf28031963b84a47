-- taskmesh: no-transaction
-- The search's indexes leave the tasks table. A state change of a task cannot be a
-- HOT update (status is indexed), so each one wrote a new entry into every index of the row,
-- those of the search (migration 0008) included: a task's insert, claim and end wrote nine
-- entries into the (created_at, id), (queue, created_at, id) and (name, created_at, id)
-- indexes whose keys never change. task_search holds those keys once per task, written when
-- the task is inserted and never again (but for the rare move of a task to another queue), so
-- the three entries are written once.
--
-- Triggers keep it in step with tasks whatever the path (INSERT, COPY, a requeue into another
-- queue, retention's deletes, TRUNCATE): the insert and delete triggers run one statement per
-- statement over its transition table, not one per row. Search windows on task_search for the
-- keys all, queue, name and tenant_id, and joins each id to tasks, which stays the truth.
--
-- Applied beside a running release: the triggers first, then the tasks of before them copied in
-- batches of 5,000 (each its own transaction, holding tasks' SHARE lock for that batch only, so
-- that no task is deleted between its read and its copy), then the indexes built concurrently.
-- The indexes of tasks the search used before leave in the contract step 0024. Every statement
-- can run again after a crash.
CREATE TABLE IF NOT EXISTS task_search (
    created_at timestamptz NOT NULL,
    id         uuid NOT NULL,
    queue      text NOT NULL,
    name       text NOT NULL,
    tenant_id  text,
    PRIMARY KEY (created_at, id)
);

CREATE OR REPLACE FUNCTION taskmesh_task_search_added() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO task_search (created_at, id, queue, name, tenant_id)
    SELECT created_at, id, queue, name, tenant_id FROM added;
    RETURN NULL;
END
$$;

-- A session plans this statement once and keeps the plan until the table's statistics change:
-- planned while task_search was small, a hash join over all of it would delete each batch of
-- retention in seconds once it holds millions of rows (650-900 ms per 1,000 rows at 2,000,000,
-- against 14-20 ms through the primary key). The lookup by primary key is the only plan.
CREATE OR REPLACE FUNCTION taskmesh_task_search_removed() RETURNS trigger
LANGUAGE plpgsql SET enable_hashjoin = off SET enable_mergejoin = off SET enable_seqscan = off AS $$
BEGIN
    DELETE FROM task_search s USING removed r WHERE s.created_at = r.created_at AND s.id = r.id;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION taskmesh_task_search_moved() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
    UPDATE task_search
    SET created_at = NEW.created_at, queue = NEW.queue, name = NEW.name, tenant_id = NEW.tenant_id
    WHERE created_at = OLD.created_at AND id = OLD.id;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION taskmesh_task_search_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE task_search;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER tasks_search_insert AFTER INSERT ON tasks REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION taskmesh_task_search_added();
CREATE OR REPLACE TRIGGER tasks_search_delete AFTER DELETE ON tasks REFERENCING OLD TABLE AS removed
    FOR EACH STATEMENT EXECUTE FUNCTION taskmesh_task_search_removed();
-- Claims and results do not set these columns, so this trigger is not even looked at for them.
CREATE OR REPLACE TRIGGER tasks_search_update AFTER UPDATE OF queue, name, tenant_id, created_at ON tasks
    FOR EACH ROW WHEN (OLD.queue IS DISTINCT FROM NEW.queue OR OLD.name IS DISTINCT FROM NEW.name
                       OR OLD.tenant_id IS DISTINCT FROM NEW.tenant_id OR OLD.created_at IS DISTINCT FROM NEW.created_at)
    EXECUTE FUNCTION taskmesh_task_search_moved();
CREATE OR REPLACE TRIGGER tasks_search_truncate AFTER TRUNCATE ON tasks
    FOR EACH STATEMENT EXECUTE FUNCTION taskmesh_task_search_truncate();

-- The tasks of before the triggers, in keyset order of (created_at, id) (tasks_created_idx). A
-- task the triggers copied meanwhile is already there (ON CONFLICT DO NOTHING).
DO $$
DECLARE
    last_created timestamptz := '-infinity';
    last_id uuid := '00000000-0000-0000-0000-000000000000';
BEGIN
    LOOP
        LOCK TABLE tasks IN SHARE MODE;
        WITH batch AS (
            SELECT created_at, id, queue, name, tenant_id FROM tasks
            WHERE (created_at, id) > (last_created, last_id)
            ORDER BY created_at, id
            LIMIT 5000
        ), copy AS (
            INSERT INTO task_search (created_at, id, queue, name, tenant_id)
            SELECT * FROM batch
            ON CONFLICT DO NOTHING
        )
        SELECT created_at, id INTO last_created, last_id FROM batch ORDER BY created_at DESC, id DESC LIMIT 1;
        EXIT WHEN NOT FOUND;
        IF current_setting('taskmesh.migrate_batches', true) = 'on' THEN
            COMMIT;
        END IF;
    END LOOP;
END
$$;

DROP INDEX CONCURRENTLY IF EXISTS task_search_queue_idx;
CREATE INDEX CONCURRENTLY task_search_queue_idx ON task_search (queue, created_at, id);
DROP INDEX CONCURRENTLY IF EXISTS task_search_name_idx;
CREATE INDEX CONCURRENTLY task_search_name_idx ON task_search (name, created_at, id);
DROP INDEX CONCURRENTLY IF EXISTS task_search_tenant_idx;
CREATE INDEX CONCURRENTLY task_search_tenant_idx ON task_search (tenant_id, created_at, id)
    WHERE tenant_id IS NOT NULL;
