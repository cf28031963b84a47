-- The console's charts: besides the runs that ended, each minute of a queue keeps how
-- long its started runs had waited (a histogram, so a p95 can be read over any span), the most
-- ready tasks and the oldest ready task's age any instance's sampler saw in it. Instances add
-- their counts (wait_counts element by element) and raise the maxima; retention is unchanged
-- (retention_stats_days). The runs and waits of every queue together are also added to the
-- rows of queue '*' (not a valid queue name), so a chart of every queue reads one row a minute
-- however many queues there are.
CREATE FUNCTION taskmesh_add_counts(a bigint[], b bigint[]) RETURNS bigint[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(coalesce(x, 0) + coalesce(y, 0) ORDER BY n), '{}')
    FROM unnest(coalesce(a, '{}'), coalesce(b, '{}')) WITH ORDINALITY AS t(x, y, n)
$$;

ALTER TABLE queue_minutes
    ADD COLUMN wait_counts bigint[] NOT NULL DEFAULT '{}',
    ADD COLUMN ready_max bigint,
    ADD COLUMN oldest_ready_max_seconds double precision;
