-- Accounts, their repository permissions, and every database credential (SPEC §5).
-- Passwords are stored as scrypt hashes with their salt and cost parameters beside them (so the
-- cost can be raised later without breaking old hashes); tokens only as SHA-256 digests.
CREATE TABLE arkvory_accounts (
    id uuid PRIMARY KEY,
    name text NOT NULL UNIQUE,
    password_hash bytea NOT NULL,
    password_salt bytea NOT NULL,
    scrypt_n integer NOT NULL,
    scrypt_r integer NOT NULL,
    scrypt_p integer NOT NULL,
    is_admin boolean NOT NULL DEFAULT false,
    disabled boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    password_changed_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE arkvory_repository_permissions (
    repository_id uuid NOT NULL REFERENCES arkvory_repositories (id) ON DELETE CASCADE,
    account_id uuid NOT NULL REFERENCES arkvory_accounts (id) ON DELETE CASCADE,
    level text NOT NULL CHECK (level IN ('read', 'write', 'admin')),
    PRIMARY KEY (repository_id, account_id)
);
CREATE INDEX arkvory_repository_permissions_account ON arkvory_repository_permissions (account_id);

-- Sessions (dps_), personal tokens (pat_) and managed service keys (arkvory_<uuid>.) in one
-- table, so resolving any of them is one indexed lookup by digest. Revoking deletes the row.
CREATE TABLE arkvory_credentials (
    id uuid PRIMARY KEY,
    kind text NOT NULL CHECK (kind IN ('session', 'pat', 'service_key')),
    digest bytea NOT NULL UNIQUE CHECK (length(digest) = 32),
    account_id uuid REFERENCES arkvory_accounts (id) ON DELETE CASCADE,
    label text NOT NULL DEFAULT '',
    -- pat: 'read' or 'read-write'; service_key: its scopes as in the keys file.
    access text CHECK (access IN ('read', 'read-write')),
    scopes text[] NOT NULL DEFAULT '{}',
    created_by text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    last_used_at timestamptz,
    CHECK ((kind = 'service_key') = (account_id IS NULL)),
    CHECK ((kind = 'pat') = (access IS NOT NULL))
);
CREATE INDEX arkvory_credentials_account ON arkvory_credentials (account_id, kind);

-- Every process caches resolved credentials only while it LISTENs on arkvory_credentials; any
-- change that could make a cached principal stale (revocation, expiry change, account disabled,
-- a permission granted or taken) notifies at commit. Recording last-used times (UPDATE OF
-- last_used_at alone) does not, or every batch would flush every cache.
CREATE FUNCTION arkvory_credentials_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('arkvory_credentials', TG_TABLE_NAME);
    RETURN NULL;
END
$$;

CREATE TRIGGER arkvory_credentials_changed
    AFTER UPDATE OF id, kind, digest, account_id, access, scopes, expires_at OR DELETE OR TRUNCATE
    ON arkvory_credentials FOR EACH STATEMENT EXECUTE FUNCTION arkvory_credentials_changed();
CREATE TRIGGER arkvory_accounts_changed
    AFTER UPDATE OF id, name, is_admin, disabled OR DELETE OR TRUNCATE
    ON arkvory_accounts FOR EACH STATEMENT EXECUTE FUNCTION arkvory_credentials_changed();
CREATE TRIGGER arkvory_repository_permissions_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
    ON arkvory_repository_permissions FOR EACH STATEMENT EXECUTE FUNCTION arkvory_credentials_changed();
