"""Storage maintenance: the cleanup and verify task kinds (kinds.py maps their names to them).

    cleanup.py         unreferenced blobs, abandoned uploads, expired keys and credentials, old tasks
    multipart_uploads.py  cleanup's aborting of an object store's abandoned multipart uploads
    retention.py       cleanup's step that applies the repositories' retention rules, in turns
    verify.py          re-hashing stored blobs, recording what is missing or corrupt
    rehash.py, rehash_objects.py  the hashing of a directory's files and of a store's objects
    kinds.py           the kinds by name, as the assembly hands them to the task machinery

May import: arkvory.shared (never its cli/), the writer's basics, tasks/, catalog/ (the artifacts
retention deletes), blobs/ and uploads/ (the upload sessions cleanup sweeps).
"""
