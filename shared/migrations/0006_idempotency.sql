-- Idempotency keys (SPEC §6): one row per (principal, client token), written in the same
-- transaction as the change it records, so a committed change always has its key and result.
CREATE TABLE arkvory_idempotency_keys (
    principal_id text NOT NULL,
    key text NOT NULL CHECK (length(key) BETWEEN 1 AND 64),
    fingerprint text NOT NULL,                -- hex SHA-256 of method, route, parameters, body
    status smallint NOT NULL,
    body text,                                -- the JSON answer as sent; NULL for no body
    headers text NOT NULL DEFAULT '{}',       -- JSON object of the headers a replay repeats
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (principal_id, key)
);
-- For the cleanup task's `delete_expired`.
CREATE INDEX arkvory_idempotency_keys_expires ON arkvory_idempotency_keys (expires_at);

-- The completed catalog API shows an asset's history, newest first (issue 7 item 6).
CREATE INDEX arkvory_asset_history_path ON arkvory_asset_history (repository_id, path, id);
