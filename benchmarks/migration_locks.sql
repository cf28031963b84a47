-- The rows benchmarks/migration_locks.py puts into its scratch database. A block runs right after
-- the migration it names (`-- after: 0001`), so it writes the schema of that moment, and is not
-- measured. current_setting('migration_locks.rows') is the --rows asked for (the tasks); the
-- other tables get the few rows a deployment has, so their locks are taken on real rows too.
-- Statements run one by one, outside a transaction (VACUUM needs that).

-- after: 0001
-- A history of --rows tasks over 90 days, oldest first: 82% completed, 6% failed (dead-lettered),
-- 6% queued, 4% cancelled, 2% running; 10% with a dedup key, a third with a tenant. Each has the
-- one run row a task had before migration 0017 (a queued task's is the queued run of its enqueue).
INSERT INTO tasks (id, name, type, queue, priority, payload, idempotency_key, max_retries, retries, attempts,
                   status, run_at, tenant_id, trace_id, created_at, updated_at)
SELECT gen_random_uuid(),
       (ARRAY['report.export', 'email.send', 'invoice.render', 'image.resize', 'crm.sync'])[1 + g % 5],
       CASE WHEN g % 20 = 1 THEN 'delayed' WHEN g % 50 = 2 THEN 'cron' ELSE 'immediate' END,
       (ARRAY['default', 'reports', 'emails', 'billing'])[1 + g % 4],
       g % 3,
       jsonb_build_object('customer', jsonb_build_object('id', g % 5000), 'items', g % 7),
       CASE WHEN g % 10 = 0 THEN 'order-' || g END,
       3, 0,
       CASE WHEN s.status = 'queued' THEN 0 ELSE 1 END,
       s.status, t.at, CASE WHEN g % 3 = 0 THEN 'tenant-' || g % 40 END,
       md5(g::text), t.at, t.at + CASE WHEN s.status IN ('queued', 'running') THEN interval '0 s' ELSE interval '2 s' END
FROM generate_series(1, current_setting('migration_locks.rows')::bigint) g,
     LATERAL (SELECT now() - interval '90 days'
                     + (interval '90 days') * (g::double precision / current_setting('migration_locks.rows')::bigint) AS at) t,
     LATERAL (SELECT CASE WHEN g % 100 < 82 THEN 'completed' WHEN g % 100 < 88 THEN 'failed'
                          WHEN g % 100 < 94 THEN 'queued' WHEN g % 100 < 98 THEN 'cancelled'
                          ELSE 'running' END AS status) s;

INSERT INTO task_runs (task_id, attempt, status, worker_id, claimed_at, started_at, finished_at, lease_expires_at,
                       error, result, created_at, updated_at)
SELECT id, 1,
       CASE status WHEN 'completed' THEN 'succeeded' WHEN 'queued' THEN 'queued' WHEN 'running' THEN 'running'
                   ELSE 'failed' END,
       CASE WHEN status <> 'queued' THEN 'worker-' || (queue) END,
       CASE WHEN status <> 'queued' THEN created_at END,
       CASE WHEN status <> 'queued' THEN created_at END,
       CASE WHEN status IN ('completed', 'failed', 'cancelled') THEN updated_at END,
       CASE WHEN status = 'running' THEN now() + interval '30 s' END,
       CASE status WHEN 'failed' THEN 'ValueError: boom' WHEN 'cancelled' THEN 'cancelled' END,
       CASE WHEN status = 'completed' THEN '{"ok": true}'::jsonb END,
       created_at, updated_at
FROM tasks;

VACUUM (ANALYZE) tasks;
VACUUM (ANALYZE) task_runs;

-- after: 0002
INSERT INTO workers (id, host, pid, queues, version, state)
SELECT 'host' || g || '-' || (1000 + g) || '-abcd', 'host' || g, 1000 + g,
       '{"default": 8, "reports": 2, "emails": 4, "billing": 2}', '0.2.0', 'running'
FROM generate_series(1, 20) g;

-- after: 0004
INSERT INTO schedules (name, cron, timezone, task, queue, priority, payload, max_retries, misfire,
                       misfire_grace_seconds, overlap, enabled, config_hash, next_fire_at)
SELECT 'schedule-' || g, '*/5 * * * *', 'UTC', 'report.export', 'reports', 0, '{}', 3, 'once', 60, 'skip', true,
       md5(g::text), now() + interval '5 minutes'
FROM generate_series(1, 50) g;

-- after: 0007
INSERT INTO queue_minutes (queue, minute, succeeded, retried, failed)
SELECT q, date_trunc('minute', now()) - m * interval '1 minute', 60, 2, 1
FROM unnest(ARRAY['default', 'reports', 'emails', 'billing']) q, generate_series(0, 7 * 1440 - 1) m;

-- after: 0009
INSERT INTO operations (id, action, status, filter, done, finished_at)
SELECT gen_random_uuid(), 'retry', 'done', '{"status": "failed"}', 100, now() - g * interval '1 hour'
FROM generate_series(1, 200) g;

-- after: 0012
INSERT INTO api_keys (id, name, secret_hash, scopes, tenant_id)
SELECT substr(translate(md5(g::text), '0189', 'wxyz'), 1, 16), 'key-' || g,
       decode(md5(g::text) || md5('s' || g), 'hex'), '{tasks:read,tasks:write}',
       CASE WHEN g % 2 = 0 THEN 'tenant-' || g % 40 END
FROM generate_series(1, 100) g;

-- after: 0013
UPDATE schedules SET tenant_id = 'tenant-' || substr(name, 10) WHERE substr(name, 10)::int % 2 = 0;

-- after: 0014
INSERT INTO audit_events (actor_type, actor_id, action, resource_type, resource_id, outcome, status)
SELECT 'key', 'key-' || g % 100, 'task.create', 'task', gen_random_uuid()::text, 'ok', 201
FROM generate_series(1, 10000) g;
