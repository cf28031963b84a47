-- The task search by one status: `status=failed` alone reads this index in
-- (created_at, id) order, so failed, cancelled, queued or running tasks are found at once
-- however many completed ones are newer. Completed tasks, the bulk of a history, are left
-- out: the index gains no entry when a task completes, and a search for them pages through
-- tasks_created_idx, where they are most of every window.
CREATE INDEX tasks_status_created_idx ON tasks (status, created_at, id) WHERE status <> 'completed';
