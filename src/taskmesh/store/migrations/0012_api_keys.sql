-- API keys: `tmk_<id>_<secret>`; only SHA-256(pepper || secret) is stored. A key
-- belongs to a principal (`name`; several keys per name, so a rotation overlaps), holds its
-- scopes, may be bound to one tenant and to some queues, may expire, and is revoked by
-- setting `revoked_at` (rows are kept for the audit trail).
CREATE TABLE api_keys (
    id text PRIMARY KEY CHECK (id ~ '^[a-z2-7]{16}$'),
    name text NOT NULL CHECK (length(name) BETWEEN 1 AND 128),
    secret_hash bytea NOT NULL CHECK (length(secret_hash) = 32),
    scopes text[] NOT NULL,
    tenant_id text,
    queues text[],
    expires_at timestamptz,
    revoked_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz
);
CREATE INDEX api_keys_name_idx ON api_keys (name);

-- The deployment's pepper, made by the first key's creation: a key's hash is worthless
-- without it, and it is the same for every instance and the CLI because they share this table.
CREATE TABLE auth_pepper (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    pepper bytea NOT NULL CHECK (length(pepper) = 32)
);
