-- Several hosts (SPEC §11, issue 16): where the blobs live, and where each process listens.
-- `location` is `file:` (the directory ARKVORY_DATA_DIR, whose path may differ per process) or
-- `s3://BUCKET[/PREFIX]`; a process configured with another ARKVORY_STORAGE_URL refuses to start,
-- and `arkvory admin migrate-storage` switches it in one transaction.
ALTER TABLE arkvory_storage ADD COLUMN location text NOT NULL DEFAULT 'file:';

-- ARKVORY_HOST:ARKVORY_PORT of the holder (host is its machine's name): several processes on
-- one host, or one host with several addresses, stay apart in `arkvory admin status`.
ALTER TABLE arkvory_gateway_leases ADD COLUMN address text;
