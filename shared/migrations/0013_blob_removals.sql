-- Removals of stored blobs that no transaction waits for (issue 22: the object store is called
-- outside every transaction and digest lock; writer/blobs/locks.py says why it is safe).
-- A removal is marked, in the transaction that decides it, before the store is asked to remove
-- the blob, and settled once the store said it is gone. While a removal of a digest is pending,
-- no upload publishes that digest; an upload that staged its bytes before a removal was marked
-- stages them again (`id` is newer than the one it saw). Settled rows are kept a day for that.
CREATE TABLE arkvory_blob_removals (
    id bigserial PRIMARY KEY,
    sha256 text NOT NULL,
    -- cleanup: an unreferenced blob or a stray one; verify: a corrupt one moved to quarantine.
    reason text NOT NULL CHECK (reason IN ('unreferenced', 'stray', 'quarantine')),
    task_id uuid,
    marked_at timestamptz NOT NULL DEFAULT now(),
    settled_at timestamptz
);
CREATE INDEX arkvory_blob_removals_sha256 ON arkvory_blob_removals (sha256, id);
CREATE UNIQUE INDEX arkvory_blob_removals_pending ON arkvory_blob_removals (sha256) WHERE settled_at IS NULL;
CREATE INDEX arkvory_blob_removals_settled ON arkvory_blob_removals (settled_at) WHERE settled_at IS NOT NULL;
