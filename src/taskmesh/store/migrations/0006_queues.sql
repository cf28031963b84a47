-- Queues an operator has acted on. A row exists once a queue was paused; a queue
-- without a row is running. The claim reads it (one primary-key probe per claim statement),
-- so a pause holds on every instance at once and survives restarts.
CREATE TABLE queues (
    name text PRIMARY KEY,
    paused_at timestamptz,
    paused_reason text CHECK (length(paused_reason) <= 500),
    updated_at timestamptz NOT NULL DEFAULT now()
);
