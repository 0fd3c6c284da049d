-- Who made each personal token and managed service key, and what ends it (SPEC §5, issue 22):
-- a credential never makes one that outlives it.
--
--   maker_account_id  the account that answers for it: the account that made it, or, for a key
--                     made by a managed key, that key's maker account; NULL when a keys-file key
--                     made it. Disabling this account suspends the managed keys it made.
--   made_through      the credential that asked for it: 'session:<uuid>', 'pat:<uuid>',
--                     'service_key:<uuid>' or 'keys_file:<key id>' (a record: it may be gone).
--   password_given    whether the account's password was given again when it was made.
--   ends_with         the credential whose end (logout, expiry, revocation, a password change
--                     ending the session, the account disabled) ends this one: the credential it
--                     was made through when no password was given. The cascade is the revocation.
--   suspended_at      a managed key whose maker account was disabled: refused until an admin
--                     adopts it (enabling the account again does not bring it back).
ALTER TABLE arkvory_credentials
    ADD COLUMN maker_account_id uuid REFERENCES arkvory_accounts (id),
    ADD COLUMN made_through text CHECK (made_through ~ '^(session|pat|service_key|keys_file):.+$'),
    ADD COLUMN password_given boolean,
    ADD COLUMN ends_with uuid REFERENCES arkvory_credentials (id) ON DELETE CASCADE,
    ADD COLUMN suspended_at timestamptz,
    ADD CHECK (suspended_at IS NULL OR kind = 'service_key');

-- The cascade of a revocation and the suspension at a disable each find their rows by index.
CREATE INDEX arkvory_credentials_ends_with ON arkvory_credentials (ends_with) WHERE ends_with IS NOT NULL;
CREATE INDEX arkvory_credentials_maker_account ON arkvory_credentials (maker_account_id)
    WHERE kind = 'service_key';

-- Rows made before this migration. What their records say is kept; what they do not say stays
-- unknown (NULL) rather than guessed:
-- * A personal token is always made by its own account; through which credential, and whether
--   with the password, is not recorded, so it is tied to nothing: it lives until its own expiry
--   (already capped at its maker's since issue 13) or a revocation, as before.
UPDATE arkvory_credentials SET maker_account_id = account_id WHERE kind = 'pat';
-- * A managed key records its maker principal in created_by: 'account:<uuid>' (a session or a
--   token of that account), 'service:<uuid>' (another managed key, whose maker account it
--   inherits) or 'key:<id>' (a keys-file key: no account). Knowing the account, a later disable
--   suspends the key as it would a new one. Not knowing the session, the key is not revoked by
--   one: it stays valid, since revoking keys of unknown making would stop running CI jobs on
--   upgrade for no reason an operator could see.
WITH RECURSIVE made (id, maker_account_id) AS (
    SELECT k.id, a.id FROM arkvory_credentials k JOIN arkvory_accounts a ON k.created_by = 'account:' || a.id::text
    WHERE k.kind = 'service_key'
    UNION
    SELECT k.id, made.maker_account_id FROM arkvory_credentials k JOIN made ON k.created_by = 'service:' || made.id::text
    WHERE k.kind = 'service_key'
)
UPDATE arkvory_credentials k SET maker_account_id = made.maker_account_id FROM made WHERE k.id = made.id;
UPDATE arkvory_credentials SET made_through = 'keys_file:' || substr(created_by, 5)
WHERE kind = 'service_key' AND created_by LIKE 'key:_%';
-- * A managed key made by a managed key was made without a password (a key has none), so it
--   ends with its maker, as a new one would, while that maker still exists.
UPDATE arkvory_credentials k SET made_through = 'service_key:' || maker.id::text, password_given = false,
    ends_with = maker.id
FROM arkvory_credentials maker
WHERE k.kind = 'service_key' AND maker.kind = 'service_key' AND k.created_by = 'service:' || maker.id::text;
-- * A managed key whose maker account is disabled already is suspended now, as the disable
--   would have done: the attack this closes (a key made by a stolen session re-enabling its
--   disabled maker) needs no new disable to be stopped. An admin adopts the key to keep it.
UPDATE arkvory_credentials k SET suspended_at = now()
FROM arkvory_accounts a
WHERE k.kind = 'service_key' AND a.id = k.maker_account_id AND a.disabled;

-- A suspension (or an adoption, which clears it) changes what a cached principal may do:
-- it notifies like a revocation (migration 0004).
DROP TRIGGER arkvory_credentials_changed ON arkvory_credentials;
CREATE TRIGGER arkvory_credentials_changed
    AFTER UPDATE OF id, kind, digest, account_id, access, scopes, expires_at, suspended_at OR DELETE OR TRUNCATE
    ON arkvory_credentials FOR EACH STATEMENT EXECUTE FUNCTION arkvory_credentials_changed();
