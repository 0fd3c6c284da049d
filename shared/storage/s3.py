"""The object-store backend (`ARKVORY_STORAGE_URL=s3://BUCKET[/PREFIX]`, SPEC §11): blobs as
objects `PREFIX/blobs/sha256/ab/cd/<hex>` of an S3-compatible store (requests: s3_client.py),
ARKVORY_DATA_DIR as this host's local state only (upload files, the read cache).

Publishing is split in two (interface.py): `stage` uploads the verified file before the publishing
transaction (a multipart upload straight to the final key: nothing is visible before
CompleteMultipartUpload, and an object already there is kept only if HEAD shows the same size and
recorded SHA-256), and `publish`, inside the transaction that holds the digest's claim, does
nothing: the removal marks checked there (writer/blobs/locks.py) prove that neither
cleanup nor verify removed the object since it was staged (else the upload stages it again). So
no transaction is ever open across a store request, not even a HEAD.

A publication that never completes (a writer stopped in the middle, a store that failed it, a
session abandoned) leaves an incomplete multipart upload at its blob's key: invisible, but its
parts take room. `incomplete_publications` lists them, `publication_parts` tells how much
arrived and when, `abort_publication` frees them (s3_multipart.py: requests obstore cannot
make); cleanup decides which (writer/maintenance/multipart_uploads.py).

Identity (SPEC §3): the writer creates `PREFIX/arkvory-storage-id` (never overwriting one) and
records the id and the location in the database; a gateway and the worker only check. A store
that cannot be reached at start-up stops the process with exit 69 (a restart may help), one that
refuses us (credentials, bucket, another installation's prefix) with 78; each message names the
setting to look at and never a secret.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import pathlib
import re
import uuid
from collections.abc import AsyncIterator, Callable

import asyncpg

from arkvory.shared.errors import StartupRefused, StorageUnreachable
from arkvory.shared.settings import ObjectStoreSettings

from .interface import BlobNotFound, BlobStat, ListedBlob, Offload, StorageRefused, StorageUnavailable
from .local import LocalState
from .read_cache import ReadCache
from .s3_client import IDENTITY_KEY, READ_CHUNK, STORAGE_URL, ObjectStat, ObjectStore, Publication, RangeReader
from .s3_direct import SUPPORTED as DIRECT_SUPPORTED
from .s3_direct import DirectRange
from .s3_multipart import IncompleteUpload, MultipartUploads, UploadParts

BLOBS = "blobs/sha256"
QUARANTINE = "quarantine/sha256"
LOCAL_ID_FILE = "arkvory-storage-id"  # in ARKVORY_DATA_DIR: the writer's host (worker_beside_writer)
_SHA256 = re.compile(r"[0-9a-f]{64}")


def blob_key(sha256: str) -> str:
    if not _SHA256.fullmatch(sha256):
        raise ValueError(f"not a SHA-256 hex digest: {sha256!r}")
    return f"{BLOBS}/{sha256[:2]}/{sha256[2:4]}/{sha256}"


def _digest_of(key: str) -> str | None:
    """The digest of a key in the blob layout, or None for anything else (left for a person)."""
    parts = key.split("/")
    if len(parts) != 5 or "/".join(parts[:2]) != BLOBS:
        return None
    top, middle, name = parts[2:]
    if not _SHA256.fullmatch(name) or name[:2] != top or name[2:4] != middle:
        return None
    return name


def _epoch(moment: datetime.datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


@dataclasses.dataclass(frozen=True)
class IncompletePublication:
    """A multipart upload to the key of blob `sha256` that was neither completed nor aborted."""

    sha256: str
    upload: IncompleteUpload
    age_s: float  # since it was initiated, by the store's clock


@dataclasses.dataclass(frozen=True)
class PublicationParts:
    """What arrived of an incomplete publication: its parts' bytes, and how long ago the newest
    part arrived (or, with none, the publication began), by the store's clock."""

    count: int
    bytes: int
    idle_s: float


class ObjectStorage(LocalState):
    kind = "s3"

    def __init__(self, root: pathlib.Path, settings: ObjectStoreSettings, store: ObjectStore | None = None) -> None:
        super().__init__(root)
        self.settings = settings
        self.location = settings.url
        self.store = store or ObjectStore(settings)
        self.multipart = MultipartUploads(settings, read_timeout=self.store.read_timeout)
        # The local read cache (read_cache.py), when ARKVORY_CACHE_MAX_BYTES asks for one: the
        # serving process attaches it after opening (shared/process/runtime.py).
        self.cache: ReadCache | None = None

    def __repr__(self) -> str:
        return f"ObjectStorage({self.location!r}, endpoint_url={self.settings.endpoint_url!r}, root={str(self.root)!r})"

    # -- reading --------------------------------------------------------------------------------

    def acquire_file(self, sha256: str) -> int | None:
        """The read cache's checked copy, if it has one; else None (streamed from the store)."""
        cache = self.cache
        return None if cache is None else cache.acquire(sha256)

    def release_file(self, sha256: str, fd: int) -> None:
        assert self.cache is not None, "acquire_file hands out descriptors of the cache only"
        self.cache.release(sha256, fd)

    def open_range(
        self, sha256: str, start: int, length: int, *, chunk_size: int = READ_CHUNK, if_match: str | None = None
    ) -> RangeReader:
        return self.store.open_range(blob_key(sha256), start, length, chunk_size=chunk_size, if_match=if_match)

    def open_direct_range(
        self, sha256: str, start: int, length: int, *, counted: Callable[[str], None] = lambda result: None
    ) -> DirectRange | None:
        """Bytes [start, start + length) on a connection of our own (s3_direct.py): into a pipe
        for a download that splices them to its client, or into the read cache's buffers. None
        when the store is reached over TLS or through an HTTP proxy (or not on Linux):
        `open_range` then."""
        if not (DIRECT_SUPPORTED and self.store.direct_reads):
            return None
        return DirectRange(self.store, blob_key(sha256), start, length, counted=counted)

    async def stat(self, sha256: str) -> BlobStat | None:
        try:
            found = await self.store.stat(blob_key(sha256))
        except BlobNotFound:
            return None
        return _blob_stat(sha256, found)

    # -- writing --------------------------------------------------------------------------------

    async def stage(self, source: str | os.PathLike, sha256: str, size: int) -> None:
        await self.store.publish(source, blob_key(sha256), sha256)

    async def open_publication(self, sha256: str, size: int) -> Publication | None:
        """A multipart upload of the blob fed while its upload still arrives (s3_client.py
        `Publication`: visible only at its `complete`); None when the store has it already
        (replacing it would change its ETag under downloads that read it with If-Match)."""
        if await self.stat(sha256) is not None:
            return None
        return self.store.open_publication(blob_key(sha256), sha256, size)

    async def publish(self, source: str | os.PathLike, sha256: str, size: int, *, link: bool = False) -> bool:
        # `stage` stored the bytes before the publishing transaction, and the digest's removal
        # marks prove in it that nobody removed them since (writer/blobs/locks.py):
        # nothing is left to do, and the store is never called inside a transaction.
        return False

    # -- maintenance ----------------------------------------------------------------------------

    async def listing(self, *, offload: Offload | None = None) -> AsyncIterator[list[ListedBlob]]:
        async for page in self.store.list(BLOBS):
            listed = []
            for item in page:
                digest = _digest_of(item.key)
                if digest is not None:
                    listed.append(ListedBlob(digest, item.size, item.last_modified.timestamp()))
            if listed:
                yield listed

    async def delete(self, digests: list[str], *, offload: Offload | None = None) -> None:
        await self.store.delete_many([blob_key(d) for d in digests])

    @property
    def publications_unlisted(self) -> str | None:
        """Why incomplete publications cannot be listed here (s3_multipart.py), or None."""
        return self.multipart.unsupported

    async def incomplete_publications(
        self, *, offload: Offload | None = None
    ) -> AsyncIterator[list[IncompletePublication]]:
        """Pages of the incomplete multipart uploads to blob keys (PREFIX/blobs/sha256/...);
        uploads to any other key are not ours and left out."""
        async for page in self.multipart.pages(BLOBS + "/", offload=offload):
            found = []
            for upload in page.uploads:
                digest = _digest_of(upload.key)
                if digest is not None:
                    age = (page.store_time - upload.initiated).total_seconds()
                    found.append(IncompletePublication(digest, upload, age))
            yield found

    async def publication_parts(
        self, publication: IncompletePublication, *, offload: Offload | None = None
    ) -> PublicationParts:
        """Its parts so far (BlobNotFound when it was completed or aborted since listed)."""
        parts: UploadParts = await self.multipart.parts(publication.upload, offload=offload)
        latest = max(publication.upload.initiated, parts.last_part or publication.upload.initiated)
        return PublicationParts(parts.count, parts.bytes, (parts.store_time - latest).total_seconds())

    async def abort_publication(self, publication: IncompletePublication, *, offload: Offload | None = None) -> None:
        """Abort it (AbortMultipartUpload): its parts go, and a writer still sending it fails at
        its next part or at its completion (it publishes from its file instead, or answers 503
        and stays resumable); nothing of it ever becomes visible. One gone already is fine."""
        await self.multipart.abort(publication.upload, offload=offload)

    async def quarantine(self, sha256: str, version: str | None) -> str | None:
        """Move the object that was hashed (its ETag `version`) to `PREFIX/quarantine/sha256/
        <digest>.<UTC time>`, kept as evidence; returns that key, or None when another object
        is under the digest now (a re-upload) or none. Call it with a removal of the digest marked
        (writer/blobs/locks.py), so no upload publishes between the look and the delete."""
        found = await self.stat(sha256)
        if found is None or (version is not None and found.version != version):
            return None
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        target = f"{QUARANTINE}/{sha256}.{stamp}"
        await self.store.copy(blob_key(sha256), target)
        await self.store.delete(blob_key(sha256))
        return target

    async def check(self) -> None:
        await self.store.check()

    async def read_storage_id(self) -> str | None:
        """The interface's identity: the PREFIX/arkvory-storage-id object."""
        return await self.store.read_identity()

    def describe(self) -> str:
        """The location and where it is (never a credential), for messages."""
        return f"{self.location} at {self.settings.endpoint_url or 'AWS S3'}"


def _blob_stat(sha256: str, found: ObjectStat) -> BlobStat:
    return BlobStat(
        sha256, found.size, _epoch(found.last_modified), stored_sha256=found.sha256, version=found.etag,
    )


# --- start-up: identity -----------------------------------------------------------------------


async def prepare_object_storage(
    conn: asyncpg.Connection, settings: ObjectStoreSettings, root: pathlib.Path, recorded: str | None
) -> ObjectStorage:
    """Writer: create the store's identity and record it on first start, otherwise insist that
    the store's id matches the database's (`recorded`)."""
    storage = ObjectStorage(root, settings)
    found = await _reach(storage)
    if recorded is None:
        if found is not None:
            raise StartupRefused(
                f"{STORAGE_URL}: {storage.describe()} has storage id {found}, but the database has none:"
                " this bucket/prefix belongs to another installation; point it at an empty prefix"
            )
        storage_id = str(uuid.uuid4())
        await _translated(storage.store.write_identity(storage_id))
        await conn.execute(
            "INSERT INTO arkvory_storage (storage_id, location) VALUES ($1, $2)",
            uuid.UUID(storage_id), storage.location, timeout=10,
        )
        found = storage_id
    _require_match(storage, recorded or found, found)
    _make_local(root)
    storage.create_local_dirs()
    _write_local_id(root, found)
    return storage


async def verify_object_storage(
    settings: ObjectStoreSettings, root: pathlib.Path, recorded: str | None, who: str,
    *, beside_writer: bool = False,
) -> ObjectStorage:
    """A gateway or the worker: the store's id must exist and match the database's; it never
    creates one. With `beside_writer` (the worker, which sweeps the writer's upload files),
    ARKVORY_DATA_DIR must be the writer's: it holds the id the writer wrote there."""
    if recorded is None:
        raise StartupRefused(
            f"the database has no storage id yet; {who} never creates storage: start the writer first"
        )
    storage = ObjectStorage(root, settings)
    if beside_writer:
        local = _read_local_id(root)
        if local != recorded:
            raise StartupRefused(
                f"ARKVORY_DATA_DIR {root} is not the writer's (no {LOCAL_ID_FILE} with storage id {recorded}):"
                f" {who} sweeps the writer's upload files, so it runs on the writer's host with its"
                " ARKVORY_DATA_DIR"
            )
    _require_match(storage, recorded, await _reach(storage))
    _make_local(root)  # local state (the read cache), not storage
    return storage


async def _reach(storage: ObjectStorage) -> str | None:
    """The store's id (None when it has none yet), after checking that it answers us."""
    await _translated(storage.check())
    return await _translated(storage.store.read_identity())


async def _translated(work):
    try:
        return await work
    except StorageRefused as exc:
        raise StartupRefused(exc.message) from None
    except StorageUnavailable as exc:
        raise StorageUnreachable(exc.message) from None


def _require_match(storage: ObjectStorage, recorded: str | None, found: str | None) -> None:
    if found is None:
        raise StartupRefused(
            f"{STORAGE_URL}: {storage.describe()} has no {IDENTITY_KEY}, but the database expects storage"
            f" id {recorded}: wrong bucket, prefix or endpoint, or missing storage"
        )
    if recorded != found:
        raise StartupRefused(
            f"{STORAGE_URL}: storage id mismatch: {storage.describe()} has {found}, the database expects"
            f" {recorded}: this bucket/prefix belongs to another installation"
        )


def _make_local(root: pathlib.Path) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StartupRefused(
            f"ARKVORY_DATA_DIR {root}: cannot create this host's local state directory ({exc.strerror});"
            " it must be writable by this process"
        ) from None


def _write_local_id(root: pathlib.Path, storage_id: str) -> None:
    if _read_local_id(root) == storage_id:
        return
    partial = root / f".{LOCAL_ID_FILE}.{os.getpid()}"
    partial.write_text(storage_id + "\n")
    os.replace(partial, root / LOCAL_ID_FILE)


def _read_local_id(root: pathlib.Path) -> str | None:
    try:
        return (root / LOCAL_ID_FILE).read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
