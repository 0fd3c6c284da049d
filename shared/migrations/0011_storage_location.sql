-- Several hosts (SPEC §11, issue 16): where the blobs live.
-- `location` is `file:` (the directory ARKVORY_DATA_DIR, whose path may differ per process) or
-- `s3://BUCKET[/PREFIX]`; a process configured with another ARKVORY_STORAGE_URL refuses to start,
-- and `arkvory admin migrate-storage` switches it in one transaction.
ALTER TABLE arkvory_storage ADD COLUMN location text NOT NULL DEFAULT 'file:';

