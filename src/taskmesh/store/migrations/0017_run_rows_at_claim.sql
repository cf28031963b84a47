-- A task's run row is written when an attempt is claimed, not at enqueue: a bulk
-- enqueue writes one row per task instead of two. Until its first claim a task shows a pending
-- run (attempt 1, queued) built from the task row; its id is the one the claim then writes, so
-- the id a client saw while the task waited is the run's id for good. Rows of tasks enqueued
-- before this migration keep their stored queued run, which the claim takes over.
CREATE FUNCTION taskmesh_run_id(task_id uuid, attempt integer) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT md5(task_id::text || '/' || attempt::text)::uuid
$$;
