-- The audit log refuses TRUNCATE as it refuses UPDATE and DELETE (migration 0014): rows leave
-- only with a whole month's partition, dropped by retention. A statement trigger on a
-- partitioned table fires for a TRUNCATE of the table, not of one partition, so every
-- partition gets its own: those there now, and each month taskmesh_audit_partitions() makes.
-- (Emptying it on purpose, a test database say, takes a superuser: within a transaction,
-- SET LOCAL session_replication_role = replica, which skips these triggers.)
CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON audit_events
    FOR EACH STATEMENT EXECUTE FUNCTION audit_events_append_only();

DO $$
DECLARE
    part record;
BEGIN
    FOR part IN
        SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'audit_events'::regclass
    LOOP
        EXECUTE format('CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON %I '
                       'FOR EACH STATEMENT EXECUTE FUNCTION audit_events_append_only()', part.relname);
    END LOOP;
END $$;

-- As in 0014, and each partition made gets the TRUNCATE guard.
CREATE OR REPLACE FUNCTION taskmesh_audit_partitions(keep_days double precision, months_ahead integer)
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
            EXECUTE format('CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON %I '
                           'FOR EACH STATEMENT EXECUTE FUNCTION audit_events_append_only()', name);
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
