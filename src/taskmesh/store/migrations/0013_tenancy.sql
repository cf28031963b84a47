-- taskmesh: no-transaction
-- Tenants. A schedule may belong to a tenant (its tasks carry it, and only that
-- tenant's keys see the schedule). A bulk operation keeps the reach of the key that started
-- it (its tenant and queues), so that only keys reaching as far see it.
ALTER TABLE schedules ADD COLUMN IF NOT EXISTS tenant_id text;
ALTER TABLE operations ADD COLUMN IF NOT EXISTS tenant_id text, ADD COLUMN IF NOT EXISTS queues text[];

-- A tenant's open tasks (queued or running), counted against its `max_queued` quota before
-- each create; the count stops at the quota, so it reads at most that many index entries.
-- Built concurrently, as every index here: creates and claims go on meanwhile. A build a crash
-- left invalid is dropped and built again.
DROP INDEX CONCURRENTLY IF EXISTS tasks_tenant_open_idx;
CREATE INDEX CONCURRENTLY tasks_tenant_open_idx ON tasks (tenant_id)
    WHERE tenant_id IS NOT NULL AND status IN ('queued', 'running');

-- A dedup key is unique within its tenant (tasks without one form one more): a tenant's key
-- can then neither be refused for a key another tenant used, nor learn that tenant's task id
-- from the answer. idempotency_key leads, so a search by dedup key still reads this index.
-- The unique index of the release before (tasks_idempotency_key_key), which its ON CONFLICT
-- names, stays until the contract step 0023: until then a dedup key is also unique across tenants.
DROP INDEX CONCURRENTLY IF EXISTS tasks_dedup_key;
CREATE UNIQUE INDEX CONCURRENTLY tasks_dedup_key ON tasks (idempotency_key, (COALESCE(tenant_id, '')));

-- A key's own request rates by class ({"read": 50, "write": 5}), instead of the settings'.
ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS rate_limits jsonb;
