-- Accounts that can be recovered and deleted (issue 25 §1, SPEC §5).
--
-- An administrator's password reset sets `must_change_password`: the password is one the
-- administrator chose and knows, so until the account sets its own, its sessions may do nothing
-- but that (shared/auth/credentials.py, writer/identity/account_lifecycle.py). Changing the
-- flag changes what a cached session may do: it notifies like a disable (migration 0004).
ALTER TABLE arkvory_accounts ADD COLUMN must_change_password boolean NOT NULL DEFAULT false;

DROP TRIGGER arkvory_accounts_changed ON arkvory_accounts;
CREATE TRIGGER arkvory_accounts_changed
    AFTER UPDATE OF id, name, is_admin, disabled, must_change_password OR DELETE OR TRUNCATE
    ON arkvory_accounts FOR EACH STATEMENT EXECUTE FUNCTION arkvory_credentials_changed();

-- Deleting an account deletes its sessions, tokens and permissions (their cascades of migration
-- 0004) and suspends the managed keys it made, as a disable does (migration 0014); those keys
-- then answer to no account until an administrator adopts them, so their maker goes NULL
-- instead of the foreign key refusing the delete. `created_by` still says who made them.
ALTER TABLE arkvory_credentials DROP CONSTRAINT arkvory_credentials_maker_account_id_fkey;
ALTER TABLE arkvory_credentials ADD CONSTRAINT arkvory_credentials_maker_account_id_fkey
    FOREIGN KEY (maker_account_id) REFERENCES arkvory_accounts (id) ON DELETE SET NULL;

-- Who uploaded each artifact, as it was at the upload: the principal's kind ('account', a managed
-- key 'service', a keys-file 'key'), its id (the account's or key's uuid, the keys-file key's id)
-- and its name (the account's name, the managed key's label, the keys-file key's id). Copied, not
-- referenced: an artifact outlives the account that uploaded it and still says who it was.
-- Artifacts uploaded before this migration: NULL, unknown.
ALTER TABLE arkvory_artifacts
    ADD COLUMN uploaded_by_kind text CHECK (uploaded_by_kind IN ('account', 'service', 'key')),
    ADD COLUMN uploaded_by_id text,
    ADD COLUMN uploaded_by_name text,
    ADD CHECK ((uploaded_by_kind IS NULL) = (uploaded_by_id IS NULL));
