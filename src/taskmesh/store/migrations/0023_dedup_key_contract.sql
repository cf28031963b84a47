-- taskmesh: contract
-- The contract step of the per-tenant dedup key (0013) and of the dedup index of keyed tasks
-- only (0019): the indexes whose ON CONFLICT targets the releases before those name leave,
-- once no instance of another version runs. From here a dedup key is unique per tenant only.
-- A database that applied 0013 and 0019 before they kept those indexes has neither to drop.
--
-- DROP INDEX takes an ACCESS EXCLUSIVE lock on tasks for a moment; waiting for it behind a long
-- transaction would hold up every statement queued after it, so it gives up after 5 s
-- (a transient error: run `taskmesh migrate` again).
SET LOCAL lock_timeout = '5s';
DROP INDEX IF EXISTS tasks_idempotency_key_key;
DO $$
BEGIN
    IF to_regclass('tasks_dedup_key_keyed') IS NOT NULL THEN
        DROP INDEX tasks_dedup_key;
        ALTER INDEX tasks_dedup_key_keyed RENAME TO tasks_dedup_key;
    END IF;
END
$$;
