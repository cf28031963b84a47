-- taskmesh: no-transaction
-- The indexes of workflow tasks, built beside a running release (only rows of a workflow are in
-- them: every other task pays the predicate's test only), and the wider status CHECK of 0025
-- validated before the narrower one of 0001 leaves. Dropping a CHECK that a wider one replaces
-- takes nothing from the previous release (it writes none of the new statuses), so this is an
-- expand step. Every statement can run again after a crash.
--
-- A node's tasks by state: where taskmesh_node_state looks (three probes per node).
CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_workflow_idx ON tasks (workflow_id, workflow_node, status)
    WHERE workflow_id IS NOT NULL;
-- The tasks of a workflow not ended yet: whether it is over, in one probe.
CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_workflow_open_idx ON tasks (workflow_id)
    WHERE workflow_id IS NOT NULL AND status IN ('blocked', 'queued', 'running');
-- A node's tasks that ended badly: whether a map of 10,000 has a failed one, in one probe (through
-- tasks_workflow_idx, status was a filter over every entry of the node).
CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_workflow_bad_idx ON tasks (workflow_id, workflow_node)
    WHERE workflow_id IS NOT NULL AND status IN ('failed', 'cancelled', 'skipped');
ALTER TABLE tasks VALIDATE CONSTRAINT tasks_status_valid;
SET lock_timeout = '5s';
ALTER TABLE tasks DROP CONSTRAINT IF EXISTS tasks_status_check;
RESET lock_timeout;
