"""Where blobs live. Callers import the storage API from here, not from a backend's module:

    from arkvory.shared.storage import BlobStorage, open_storage

interface.py is the interface every caller uses (reading, publishing, maintenance, identity) and
its errors; directory.py is the directory backend (`file:`: the content-addressed layout in
ARKVORY_DATA_DIR), s3.py the object-store backend (`s3://`; its requests in s3_client.py, loaded
only when configured, s3_direct.py, which reads a plain-http store on connections of its
own, and s3_multipart.py, the incomplete multipart uploads that obstore cannot list or abort,
signed by sigv4.py); opening.py opens the one the settings name and checks its identity; health.py keeps watch
on whether it answers; read_cache.py is the local read cache of an object store's blobs
(ARKVORY_CACHE_MAX_BYTES), cache_files.py its files on disk and the reused page-aligned buffers
(the writer's upload buffers are a BufferPool too). local.py is the host's local state both
share (upload files, free space); open_blobs.py keeps the descriptors the download path reuses,
upload_files.py the upload files in use and their removal.

May import: the basics (settings, errors, logs, metrics, db). Not http/ or cluster/, which stand
beside it, nor anything above.
"""

from .directory import ID_FILE, Storage, prepare_storage, verify_storage
from .health import StorageHealth
from .interface import (
    BlobNotFound,
    BlobReader,
    BlobStat,
    BlobStorage,
    ListedBlob,
    PipedReader,
    StorageError,
    StorageRefused,
    StorageUnavailable,
)
from .local import UPLOAD_PREFIX, LocalState, fsync_directory, is_out_of_space, out_of_space, to_the_end
from .opening import open_storage, recorded_storage

__all__ = [
    "ID_FILE",
    "UPLOAD_PREFIX",
    "BlobNotFound",
    "BlobReader",
    "BlobStat",
    "BlobStorage",
    "ListedBlob",
    "LocalState",
    "PipedReader",
    "Storage",
    "StorageError",
    "StorageHealth",
    "StorageRefused",
    "StorageUnavailable",
    "fsync_directory",
    "is_out_of_space",
    "open_storage",
    "out_of_space",
    "prepare_storage",
    "recorded_storage",
    "to_the_end",
    "verify_storage",
]
