-- The failure model.
-- A failed run keeps its handler's traceback (bounded to 16 KiB by the executor).
ALTER TABLE task_runs ADD COLUMN traceback text;
-- The reconciler walks whole backlogs in (run_at, id) order, page by page: the id makes the
-- keyset exact where many tasks share a run_at (a bulk enqueue), and the walk an index range scan.
CREATE INDEX tasks_queued_key_idx ON tasks (queue, run_at, id) WHERE status = 'queued';
DROP INDEX tasks_queued_idx;
-- Retention finds each finished state's old rows through one partial index, dead-lettered ones too
-- (before, their generic plan scanned the table: one delete statement per status now, see queries.sql).
CREATE INDEX tasks_finished_at_idx ON tasks (status, updated_at) WHERE status IN ('completed', 'cancelled', 'failed');
DROP INDEX tasks_finished_idx;
-- The dead-letter queue is read in (updated_at, id) order per queue: with the id in the index a
-- page is an index range scan that stops at its limit, not a sort of every failed task.
CREATE INDEX tasks_failed_key_idx ON tasks (queue, updated_at, id) WHERE status = 'failed';
DROP INDEX tasks_failed_idx;
