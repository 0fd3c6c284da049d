-- Resumable upload sessions (SPEC §6, issue 7 item 4). A session's bytes live in one file,
-- <data>/uploads/<id>, written part by part at offset index * part_size; a part row is
-- inserted only after its bytes are on disk, so the rows say exactly what a resume may skip.
-- A session is created under a required Idempotency-Key (writer/idempotency.py records the
-- key in the transaction that inserts the row), so a retried create never makes two.
CREATE TABLE arkvory_uploads (
    id uuid PRIMARY KEY,
    repository_id uuid NOT NULL REFERENCES arkvory_repositories (id) ON DELETE CASCADE,
    principal_id text NOT NULL,
    name text NOT NULL,
    size bigint NOT NULL CHECK (size >= 0),
    sha256 text CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    media_type text NOT NULL,
    part_size integer NOT NULL CHECK (part_size > 0),
    -- open: receiving parts; completed: published as artifact_id (kept for replays until expiry)
    status text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'completed')),
    artifact_id uuid REFERENCES arkvory_artifacts (id) ON DELETE SET NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX arkvory_uploads_expiry ON arkvory_uploads (expires_at);
CREATE INDEX arkvory_uploads_open ON arkvory_uploads (principal_id) WHERE status = 'open';

CREATE TABLE arkvory_upload_parts (
    upload_id uuid NOT NULL REFERENCES arkvory_uploads (id) ON DELETE CASCADE,
    index integer NOT NULL CHECK (index >= 0),
    size integer NOT NULL CHECK (size > 0),
    sha256 text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (upload_id, index)
);
