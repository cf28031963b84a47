-- Retention of finished tasks: finished rows are found by age without a scan.
CREATE INDEX tasks_finished_idx ON tasks (status, updated_at) WHERE status IN ('completed', 'cancelled');
