-- Lists (issue 25): every order a list offers, and every filter by name prefix, is a range of one
-- index, so a page costs its own rows however large the repository and however deep the client
-- pages, newest or oldest first (writer/pagination.py; tests/test_list_indexes.py EXPLAINs each).
--
-- Names sort and match prefixes in byte order, COLLATE "C", whatever the database's collation: a
-- prefix is a range only in an index of that collation (a linguistic one sorts 'a-b' between 'ab'
-- and 'ac'), and the order is then the same on every installation. On a database whose collation
-- is C already these repeat the primary keys' columns; the planner does not know they are the same.

-- Repositories by name.
CREATE INDEX arkvory_repositories_name_bytes ON arkvory_repositories (name COLLATE "C");

-- Artifacts of a repository by upload time, either way; by name (exact or prefix) in that order.
CREATE INDEX arkvory_artifacts_listing ON arkvory_artifacts (repository_id, created_at, id);
DROP INDEX arkvory_artifacts_repository;  -- (repository_id, created_at): the one above covers it
CREATE INDEX arkvory_artifacts_name ON arkvory_artifacts (repository_id, name COLLATE "C", created_at, id);

-- Package versions by coordinates (a group, a group and a name, a name prefix in a group), by
-- publication time either way, and by name or name prefix in any group.
CREATE INDEX arkvory_packages_listing
    ON arkvory_packages (repository_id, group_name COLLATE "C", name COLLATE "C", version COLLATE "C");
CREATE INDEX arkvory_packages_published
    ON arkvory_packages (repository_id, published_at, group_name COLLATE "C", name COLLATE "C", version COLLATE "C");
CREATE INDEX arkvory_packages_name ON arkvory_packages (repository_id, name COLLATE "C");

-- Assets by path and path prefix.
CREATE INDEX arkvory_assets_listing ON arkvory_assets (repository_id, path COLLATE "C");

-- Accounts newest or oldest first (by name: migration 0012's folded index).
CREATE INDEX arkvory_accounts_created ON arkvory_accounts (created_at, id);

-- Managed service keys, either way (personal tokens are few per account: its own index).
CREATE INDEX arkvory_credentials_service_keys ON arkvory_credentials (created_at, id) WHERE kind = 'service_key';

-- Storage diagnostics newest or oldest detection first (by digest: the primary key).
CREATE INDEX arkvory_storage_diagnostics_detected ON arkvory_storage_diagnostics (detected_at, sha256);
