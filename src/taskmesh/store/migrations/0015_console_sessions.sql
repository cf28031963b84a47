-- Console sessions: a person signs in to /console with an API key and gets a session
-- cookie; only SHA-256 of the cookie's secret is stored. The session acts as its key: the key's
-- scopes, tenant, queues and rate limits, and a revoked or expired key ends its sessions within
-- the key cache's period. `csrf_token` is sent back by the console's forms and checked on every
-- change. On an open instance (no key made yet, on loopback) a visitor gets a session without
-- a key (`key_id` NULL), which stops working once the instance is closed by its first key.
-- Sign-out deletes the row; expired rows are deleted by retention.
CREATE TABLE console_sessions (
    id_hash bytea PRIMARY KEY CHECK (length(id_hash) = 32),
    key_id text REFERENCES api_keys (id) ON DELETE CASCADE,
    csrf_token text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX console_sessions_expires_idx ON console_sessions (expires_at);
