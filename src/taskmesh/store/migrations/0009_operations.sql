-- Bulk operations: an action on every task a filter matches, run in the background in
-- batches by whichever instance holds its lease, resumable from its keyset cursor when that
-- instance dies. One row per operation; its counters move with each batch, in the batch's
-- transaction, so that every task is counted once.
CREATE TABLE operations (
    id uuid PRIMARY KEY,
    action text NOT NULL CHECK (action IN ('retry', 'replay', 'cancel', 'delete')),
    status text NOT NULL CHECK (status IN ('running', 'done', 'failed')),
    filter jsonb NOT NULL,
    reason text,
    done bigint NOT NULL DEFAULT 0,
    skipped bigint NOT NULL DEFAULT 0,
    cursor_created_at timestamptz,
    cursor_id uuid,
    lease_owner text,
    lease_expires_at timestamptz,
    error text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX operations_running_idx ON operations (created_at) WHERE status = 'running';
