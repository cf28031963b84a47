-- The audit log: who did what to which resource, and how it ended. Append-only:
-- a trigger refuses UPDATE and DELETE (dropping a whole month's partition is the only way
-- rows leave, by retention). Partitioned by month of `at`; taskmesh_audit_partitions() makes
-- the months ahead and drops those past retention (the retention service calls it). The
-- default partition catches rows only if months were not made ahead (it stays empty).
CREATE TABLE audit_events (
    id          bigint GENERATED ALWAYS AS IDENTITY,
    at          timestamptz NOT NULL DEFAULT now(),
    actor_type  text NOT NULL CHECK (actor_type IN ('key', 'cli', 'system', 'anonymous')),
    actor_id    text,
    actor_name  text,
    tenant_id   text,
    action      text NOT NULL,
    resource_type text,
    resource_id text,
    outcome     text NOT NULL CHECK (outcome IN ('ok', 'denied', 'error')),
    status      integer,
    reason      text,
    trace_id    text,
    client_addr text,
    user_agent  text,
    details     jsonb,
    PRIMARY KEY (at, id)
) PARTITION BY RANGE (at);
CREATE INDEX audit_events_tenant_idx ON audit_events (tenant_id, at, id) WHERE tenant_id IS NOT NULL;
CREATE INDEX audit_events_actor_idx ON audit_events (actor_id, at, id);
CREATE TABLE audit_events_default PARTITION OF audit_events DEFAULT;

CREATE FUNCTION audit_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_events is append-only (% refused)', TG_OP;
END $$;
CREATE TRIGGER audit_events_append_only BEFORE UPDATE OR DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_events_append_only();

-- Make the partitions of this month and the next $2 months; drop those whose month ended more
-- than $1 days ago. Returns the names made and dropped ('+name', '-name').
CREATE FUNCTION taskmesh_audit_partitions(keep_days double precision, months_ahead integer)
RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE
    month  timestamptz := date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    name   text;
    bound  text;
    ends   timestamptz;
    done   text[] := '{}';
    part   record;
BEGIN
    FOR i IN 0..months_ahead LOOP
        name := 'audit_events_' || to_char((month + make_interval(months => i)) AT TIME ZONE 'UTC', 'YYYYMM');
        IF to_regclass(name) IS NULL THEN
            EXECUTE format('CREATE TABLE %I PARTITION OF audit_events FOR VALUES FROM (%L) TO (%L)',
                           name, month + make_interval(months => i), month + make_interval(months => i + 1));
            done := done || ('+' || name);
        END IF;
    END LOOP;
    FOR part IN
        SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) AS spec
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'audit_events'::regclass AND c.relname ~ '^audit_events_[0-9]{6}$'
    LOOP
        bound := substring(part.spec FROM 'TO \(''([^'']+)''\)');
        ends := bound::timestamptz;
        IF keep_days > 0 AND ends < now() - make_interval(secs => keep_days * 86400) THEN
            EXECUTE format('DROP TABLE %I', part.relname);
            done := done || ('-' || part.relname);
        END IF;
    END LOOP;
    RETURN done;
END $$;

SELECT taskmesh_audit_partitions(0, 2);
