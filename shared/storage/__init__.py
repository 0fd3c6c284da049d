"""Where blobs live. Callers import the storage API from here, not from the backend's module:

    from arkvory.shared.storage import Storage, prepare_storage, verify_storage

directory.py is the storage directory (its identity and the content-addressed blob layout);
open_blobs.py keeps the descriptors the download path reuses, upload_files.py the upload files
in use and their removal.

May import: the basics (settings, errors, logs, metrics, db). Not http/ or cluster/, which stand
beside it, nor anything above.
"""

from .directory import (
    ID_FILE,
    UPLOAD_PREFIX,
    Storage,
    fsync_directory,
    is_out_of_space,
    out_of_space,
    prepare_storage,
    to_the_end,
    verify_storage,
)

__all__ = [
    "ID_FILE",
    "UPLOAD_PREFIX",
    "Storage",
    "fsync_directory",
    "is_out_of_space",
    "out_of_space",
    "prepare_storage",
    "to_the_end",
    "verify_storage",
]
