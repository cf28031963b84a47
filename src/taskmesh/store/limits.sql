-- Limits set at run time (PUT /api/v1/limits/{name}, `taskmesh limits set`): each overrides the
-- configured limit of its name, or adds one, on every instance within a second (limits/live.py).

-- name: limit_list
SELECT name, settings::text AS settings, updated_at, updated_by FROM limits ORDER BY name;

-- name: limit_upsert
INSERT INTO limits (name, settings, updated_at, updated_by) VALUES ($1, $2::jsonb, now(), $3)
ON CONFLICT (name) DO UPDATE SET settings = EXCLUDED.settings, updated_at = now(), updated_by = EXCLUDED.updated_by
RETURNING name, settings::text AS settings, updated_at, updated_by;

-- name: limit_delete
DELETE FROM limits WHERE name = $1 RETURNING name;
