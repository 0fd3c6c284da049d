-- The audit trail (issue 25 item 11, writer/audit/): one row per change, written in the same
-- transaction as the change where there is one, so a change rolled back leaves no row and a
-- committed one always has its row. Never a secret: no password, token, key secret or digest of
-- one; a credential is named by its row id, the half of a token that authenticates nothing.
--
--   actor_kind       account | service (a managed key) | key (a keys-file key) | anonymous | tool
--   actor_id         the principal's id: account:<uuid>, service:<uuid>, key:<id>, anonymous,
--                    or tool:<command> for an admin tool run on the database host
--   actor_name       the account's name, the keys-file key's id, the managed key's label, or
--                    the system user and host a tool ran as (user@host); kept when they go
--   credential_kind  session | pat | service_key: the database credential the change used
--   credential_id    its id (arkvory_credentials.id, no foreign key: the row outlives it)
--   action           what was done, `family.verb` (writer/audit/actions.py lists them)
--   outcome, status  ok with the answer's status, or refused with the refusal's (401, 403)
--   repository       the repository the change is in, if any
--   target           what it changed: an artifact's id, group/name/version, an asset's path,
--                    an account's name, a credential's, task's or upload's id
--   details          a bounded summary of the parameters, secrets left out (writer/audit/summary.py)
--   client_address   the client as seen through ARKVORY_TRUSTED_PROXIES; NULL for a tool
--   request_id       the request's X-Request-Id; NULL for a tool
CREATE TABLE arkvory_audit (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    actor_kind text NOT NULL,
    actor_id text NOT NULL,
    actor_name text,
    credential_kind text CHECK (credential_kind IN ('session', 'pat', 'service_key')),
    credential_id uuid,
    action text NOT NULL,
    outcome text NOT NULL CHECK (outcome IN ('ok', 'refused')),
    status smallint,
    repository text,
    target text,
    details jsonb NOT NULL DEFAULT '{}',
    client_address text,
    request_id text
);

-- The list is newest first (at, id), whole or filtered by one of these; the retention's
-- pruning deletes the oldest through the first one.
CREATE INDEX arkvory_audit_at ON arkvory_audit (at, id);
CREATE INDEX arkvory_audit_actor ON arkvory_audit (actor_id, at, id);
CREATE INDEX arkvory_audit_actor_name ON arkvory_audit (lower(actor_name), at, id) WHERE actor_name IS NOT NULL;
CREATE INDEX arkvory_audit_action ON arkvory_audit (action, at, id);
CREATE INDEX arkvory_audit_target ON arkvory_audit (target, at, id) WHERE target IS NOT NULL;
CREATE INDEX arkvory_audit_repository ON arkvory_audit (repository, at, id) WHERE repository IS NOT NULL;
