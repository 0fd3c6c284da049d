-- Retention rules (issue 25 item 10): per repository, which artifacts the cleanup task deletes.
--
-- An artifact is deleted only when it is beyond the repository's newest `keep_newest` (newest by
-- created_at, then id) AND older than `keep_younger_than_s`; a rule with one of the two keeps by
-- that one alone. A package version or an asset pointing at an artifact always keeps it.
-- A rule exists disabled until someone enables it (the preview shows what it would delete).
--
--   turn_at        when the cleanup last took this repository's turn (NULL: never): runs serve
--                  the repositories least recently served first, so a repository with a
--                  backlog shares each run's bound with the others (writer/maintenance/retention.py).
--   deleted_total  artifacts the cleanup deleted under this repository's rules, in all.
CREATE TABLE arkvory_retention_rules (
    repository_id uuid PRIMARY KEY REFERENCES arkvory_repositories (id) ON DELETE CASCADE,
    keep_newest integer CHECK (keep_newest BETWEEN 1 AND 100000),
    keep_younger_than_s bigint CHECK (keep_younger_than_s BETWEEN 60 AND 3153600000),
    enabled boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now(),
    turn_at timestamptz,
    deleted_total bigint NOT NULL DEFAULT 0,
    CHECK (keep_newest IS NOT NULL OR keep_younger_than_s IS NOT NULL)
);
CREATE INDEX arkvory_retention_rules_turns ON arkvory_retention_rules (turn_at NULLS FIRST, repository_id)
    WHERE enabled;

-- Whether a package version or an asset holds an artifact, and the history entries that name it,
-- are looked up by artifact for every artifact retention (or a user) deletes.
CREATE INDEX arkvory_packages_artifact ON arkvory_packages (artifact_id);
CREATE INDEX arkvory_assets_artifact ON arkvory_assets (artifact_id);
CREATE INDEX arkvory_asset_history_artifact ON arkvory_asset_history (artifact_id);
