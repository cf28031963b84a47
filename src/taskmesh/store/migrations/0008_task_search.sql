-- The task search: newest (or oldest) first by (created_at, id), each page a range
-- scan of one of these, so no filter combination reads the history.
CREATE INDEX tasks_created_idx ON tasks (created_at, id);
CREATE INDEX tasks_queue_created_idx ON tasks (queue, created_at, id);
CREATE INDEX tasks_name_created_idx ON tasks (name, created_at, id);
CREATE INDEX tasks_tenant_created_idx ON tasks (tenant_id, created_at, id) WHERE tenant_id IS NOT NULL;
-- payload.customer.id=42 is answered as payload @> '{"customer": {"id": 42}}' through this index.
CREATE INDEX tasks_payload_idx ON tasks USING gin (payload jsonb_path_ops);
