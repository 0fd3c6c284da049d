-- The catalog: repositories, content-addressed blobs, artifacts, packages, assets (SPEC §3, §6).
CREATE TABLE arkvory_repositories (
    id uuid PRIMARY KEY,
    name text NOT NULL UNIQUE,
    public boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE arkvory_blobs (
    sha256 text PRIMARY KEY CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    size bigint NOT NULL CHECK (size >= 0),
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE arkvory_artifacts (
    id uuid PRIMARY KEY,
    repository_id uuid NOT NULL REFERENCES arkvory_repositories (id) ON DELETE CASCADE,
    name text NOT NULL,
    sha256 text NOT NULL REFERENCES arkvory_blobs (sha256),
    size bigint NOT NULL,
    media_type text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX arkvory_artifacts_repository ON arkvory_artifacts (repository_id, created_at);
CREATE INDEX arkvory_artifacts_sha256 ON arkvory_artifacts (sha256);

CREATE TABLE arkvory_packages (
    repository_id uuid NOT NULL REFERENCES arkvory_repositories (id) ON DELETE CASCADE,
    group_name text NOT NULL,
    name text NOT NULL,
    version text NOT NULL,
    artifact_id uuid NOT NULL REFERENCES arkvory_artifacts (id),
    published_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (repository_id, group_name, name, version)
);

CREATE TABLE arkvory_assets (
    repository_id uuid NOT NULL REFERENCES arkvory_repositories (id) ON DELETE CASCADE,
    path text NOT NULL,
    artifact_id uuid NOT NULL REFERENCES arkvory_artifacts (id),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (repository_id, path)
);

CREATE TABLE arkvory_asset_history (
    id bigserial PRIMARY KEY,
    repository_id uuid NOT NULL REFERENCES arkvory_repositories (id) ON DELETE CASCADE,
    path text NOT NULL,
    artifact_id uuid NOT NULL,
    pointed_at timestamptz NOT NULL DEFAULT now()
);

-- Read pins: a process streaming a blob keeps a row here so cleanup never deletes it.
-- Rows are refreshed by the process's heartbeat and expire on their own with its lease.
CREATE TABLE arkvory_read_pins (
    slot integer NOT NULL,
    sha256 text NOT NULL,
    pinned_until timestamptz NOT NULL,
    PRIMARY KEY (slot, sha256)
);
CREATE INDEX arkvory_read_pins_sha256 ON arkvory_read_pins (sha256, pinned_until);
