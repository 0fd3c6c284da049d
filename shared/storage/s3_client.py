"""The S3 client of the object-store backend (s3.py), on obstore (docs/s3-client-choice.md):
the requests Arkvory makes of a bucket, with obstore's errors translated into the storage errors
(interface.py), one line naming the setting to look at and never a secret.

- `ObjectStore`: `check`, `stat`, `open_range` (a cancellable reader of zero-copy buffers),
  `presign_get` (a SigV4 query-signed GET URL for s3_direct.py, which reads a plain-http store
  on connections of its own; the URL carries a signature and is never logged or shown),
  `publish` (multipart upload straight to the final key: S3 makes an object visible only when
  CompleteMultipartUpload succeeds, so nothing partial is ever visible; the SHA-256 rides along
  as user metadata `x-amz-meta-sha256`, so an existing object is verified by one HEAD),
  `open_publication` (the same upload fed while the bytes still arrive: `Publication`), `copy`,
  `delete`, `list` (pages, resumable after a key), `read_identity` / `write_identity`.
- Settings come from shared/settings.py (`ObjectStoreSettings`): ARKVORY_STORAGE_URL,
  ARKVORY_S3_ENDPOINT_URL, ARKVORY_S3_REGION and AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
  AWS_SESSION_TOKEN (else the usual AWS credential chain).

Keys given to and returned by `ObjectStore` are relative to the prefix
(`blobs/sha256/ab/cd/<hex>`); the prefix is added and removed here.

It stays one module past the usual length on purpose: it is the one place that speaks obstore,
and the error translation (`classify`) must see every request.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import pathlib
import re
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Mapping
from typing import Any

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    BaseError,
    NotFoundError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
)
from obstore.store import S3Store

from arkvory.shared.settings import (
    AWS_ACCESS_KEY_ID as ACCESS_KEY,
    AWS_SECRET_ACCESS_KEY as SECRET_KEY,
    ObjectStoreSettings,
)

from .interface import BlobNotFound, StorageError, StorageRefused, StorageUnavailable

IDENTITY_KEY = "arkvory-storage-id"
SHA256_ATTRIBUTE = "sha256"  # stored as x-amz-meta-sha256
READ_CHUNK = 1024 * 1024  # bytes per buffer handed to Python: ~1,000 calls per GiB
# A presigned GET is sent at once (S3 checks the expiry when the request arrives, not while its
# body flows): a short life leaves little to replay should the URL ever leak.
PRESIGN_S = 60
# A streamed read's whole-request timeout: a throttled download may keep its GET open for hours,
# so what bounds it is the read timeout (no byte for that long); this only ends a runaway one.
STREAM_TIMEOUT_S = 7 * 24 * 3600.0
PART_SIZE = 16 * 1024 * 1024
PUT_CONCURRENCY = 4
LIST_PAGE = 1000

STORAGE_URL = "ARKVORY_STORAGE_URL"
ENDPOINT_URL = "ARKVORY_S3_ENDPOINT_URL"

_SHA256 = re.compile(r"[0-9a-f]{64}")
_S3_CODE = re.compile(r"<Code>([A-Za-z]+)</Code>")
_STATUS = re.compile(r"status code: (\d{3})")
_CREDENTIAL_CODES = {
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken",
    "ExpiredToken", "TokenRefreshRequired", "AuthorizationHeaderMalformed",
}


# --- errors: the storage interface's, under the names this module speaks of ---------------------

ObjectStoreError = StorageError
NotFound = BlobNotFound
Unavailable = StorageUnavailable
Refused = StorageRefused


# --- what the store says -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ObjectStat:
    key: str
    size: int
    etag: str | None
    last_modified: datetime.datetime | None
    sha256: str | None = None  # from x-amz-meta-sha256, when the object has it


@dataclasses.dataclass(frozen=True)
class ListedObject:
    key: str
    size: int
    last_modified: datetime.datetime
    etag: str | None


class ObjectStore:
    """One bucket (and prefix) of an S3-compatible store.

    Two obstore clients share the settings: one for requests that end quickly (a whole-request
    timeout), one for streamed reads, which a throttled download may keep open for hours and
    which are bounded by a read timeout instead (no byte for `read_timeout`: the store is gone).
    """

    def __init__(
        self,
        settings: ObjectStoreSettings,
        *,
        connect_timeout: float = 5.0,
        request_timeout: float = 120.0,
        read_timeout: float = 30.0,
        max_retries: int = 2,
    ) -> None:
        self.settings = settings
        self._prefix = settings.prefix + "/" if settings.prefix else ""
        # What s3_direct.py's own connections keep to, as obstore's do.
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_retries = max_retries
        # No retry starts later than this after a request's first attempt (obstore's rule).
        self.retry_timeout = max(connect_timeout * 2, 5.0)
        self._direct = self._direct_possible()
        retry = {
            "max_retries": max_retries,
            "retry_timeout": datetime.timedelta(seconds=self.retry_timeout),
            "backoff": {
                "init_backoff": datetime.timedelta(milliseconds=100),
                "max_backoff": datetime.timedelta(seconds=1),
                "base": 2,
            },
        }
        self._store = self._client(
            retry, connect_timeout=connect_timeout, timeout=request_timeout,
            read_timeout=read_timeout,
        )
        self._stream_store = self._client(
            retry, connect_timeout=connect_timeout, timeout=STREAM_TIMEOUT_S,
            read_timeout=read_timeout,
        )

    def __repr__(self) -> str:
        return f"ObjectStore({self.settings.url!r}, endpoint_url={self.settings.endpoint_url!r})"

    def _client(self, retry: dict, *, connect_timeout: float, timeout: float,
                read_timeout: float) -> S3Store:
        s = self.settings
        options: dict[str, Any] = {
            "connect_timeout": datetime.timedelta(seconds=connect_timeout),
            "timeout": datetime.timedelta(seconds=timeout),
            "read_timeout": datetime.timedelta(seconds=read_timeout),
        }
        config: dict[str, Any] = {"region": s.region, "virtual_hosted_style_request": False}
        if s.endpoint_url is not None:
            config["endpoint"] = s.endpoint_url
            options["allow_http"] = s.endpoint_url.startswith("http://")
        if s.access_key_id is not None:
            config["access_key_id"] = s.access_key_id
            config["secret_access_key"] = s.secret_access_key
            if s.session_token:
                config["session_token"] = s.session_token
        # The blob's own SHA-256 (checked by the caller) and TLS protect the bytes; signing each
        # part's payload would hash every byte once more for nothing.
        config["unsigned_payload"] = True
        return S3Store(s.bucket, client_options=options, retry_config=retry, **config)

    def _full(self, key: str) -> str:
        if not key or key.startswith("/") or any(p in ("", ".", "..") for p in key.split("/")):
            raise ValueError(
                f"key: expected a relative path without empty or dot segments, got {key!r}"
            )
        return self._prefix + key

    def _relative(self, full_key: str) -> str:
        return full_key[len(self._prefix):] if full_key.startswith(self._prefix) else full_key

    # --- start-up -----------------------------------------------------------------------------

    async def check(self) -> None:
        """Reach the bucket with our credentials (one LIST of at most one key), else Refused or
        Unavailable saying which setting to look at."""
        try:
            stream = obstore.list(self._store, self._prefix or None, chunk_size=1)
            async for _ in stream:
                break
        except Exception as exc:
            raise self._error(exc, "list", self.settings.url) from None

    # --- reading ------------------------------------------------------------------------------

    async def stat(self, key: str) -> ObjectStat:
        """HEAD: size, ETag and the stored SHA-256 (NotFound if absent)."""
        full = self._full(key)
        try:
            result = await obstore.get_async(self._store, full, options={"head": True})
        except Exception as exc:
            raise self._error(exc, "stat", full) from None
        return _stat_of(key, result.meta, result.attributes)

    def open_range(
        self,
        key: str,
        start: int,
        length: int,
        *,
        chunk_size: int = READ_CHUNK,
        if_match: str | None = None,
    ) -> RangeReader:
        """A reader of bytes [start, start + length) of `key`; see `RangeReader`."""
        if start < 0 or length < 0:
            raise ValueError(f"range: expected start >= 0 and length >= 0, got {start}, {length}")
        return RangeReader(self, key, start, length, chunk_size=chunk_size, if_match=if_match)

    @property
    def direct_reads(self) -> bool:
        """An endpoint reached without TLS and without an HTTP proxy (a store beside us): its
        bytes can be read on a connection of our own (s3_direct.py)."""
        return self._direct

    def _direct_possible(self) -> bool:
        endpoint = self.settings.endpoint_url
        if endpoint is None or not endpoint.startswith("http://"):
            return False
        # obstore's HTTP client honours HTTP_PROXY/ALL_PROXY (and NO_PROXY): so do we, by
        # leaving such a store to it.
        proxies = urllib.request.getproxies_environment()
        host = urllib.parse.urlsplit(endpoint).hostname or ""
        proxied = "http" in proxies or "all" in proxies
        return not proxied or bool(urllib.request.proxy_bypass_environment(host, proxies))

    async def presign_get(self, key: str) -> str:
        """A GET URL of `key` signed in its query (SigV4, valid PRESIGN_S), for a request sent
        on a connection of our own (s3_direct.py). It is a credential for that object while it
        lives: never log it, never put it in an error."""
        full = self._full(key)
        try:
            return await obstore.sign_async(
                self._stream_store, "GET", full, datetime.timedelta(seconds=PRESIGN_S)
            )
        except Exception as exc:
            raise self._error(exc, "sign a read of", full) from None

    # --- writing ------------------------------------------------------------------------------

    async def publish(
        self,
        local_path: os.PathLike | str,
        key: str,
        sha256: str,
        *,
        part_size: int = PART_SIZE,
        concurrency: int = PUT_CONCURRENCY,
    ) -> ObjectStat:
        """Store the verified file at `key`, visible only once complete, with its SHA-256.

        An object already there with the same size and SHA-256 is kept (no upload); any other
        object at the key is replaced. Large files go by multipart upload straight to the final
        key: S3 (and SeaweedFS) show nothing at the key before CompleteMultipartUpload succeeds,
        so a failure at any step leaves the previous state and a repeat starts over cleanly.
        """
        _check_sha256(sha256)
        path = pathlib.Path(local_path)
        size = path.stat().st_size
        full = self._full(key)
        try:
            existing = await self.stat(key)
        except NotFound:
            existing = None
        if existing is not None and existing.size == size and existing.sha256 == sha256:
            return existing
        try:
            await obstore.put_async(
                self._store, full, path,
                attributes={"Content-Type": "application/octet-stream", SHA256_ATTRIBUTE: sha256},
                use_multipart=size > part_size, chunk_size=part_size, max_concurrency=concurrency,
            )
        except Exception as exc:
            raise self._error(exc, "publish", full) from None
        return _published(await self.stat(key), full, size, sha256)

    def open_publication(self, key: str, sha256: str, size: int) -> Publication:
        """A multipart upload to `key` that the caller feeds in order (`write`) while the bytes
        are still arriving, made visible only by `complete`; see `Publication`."""
        _check_sha256(sha256)
        return Publication(self, key, sha256, size)

    async def delete(self, key: str) -> None:
        """Delete `key`; an absent key is fine (S3 answers 204 either way)."""
        full = self._full(key)
        try:
            await obstore.delete_async(self._store, full)
        except Exception as exc:
            error = self._error(exc, "delete", full)
            if not isinstance(error, NotFound):
                raise error from None

    async def delete_many(self, keys: list[str]) -> None:
        """Delete these keys (absent ones are fine): DeleteObjects, up to 1,000 keys a request."""
        if not keys:
            return
        full = [self._full(key) for key in keys]
        try:
            await obstore.delete_async(self._store, full)
        except Exception as exc:
            error = self._error(exc, "delete", f"{len(full)} objects under {self.settings.url}")
            if not isinstance(error, NotFound):
                raise error from None

    async def copy(self, from_key: str, to_key: str) -> None:
        """Server-side copy (CopyObject: up to 5 GiB on AWS; metadata kept)."""
        source, target = self._full(from_key), self._full(to_key)
        try:
            await obstore.copy_async(self._store, source, target)
        except Exception as exc:
            raise self._error(exc, "copy", source) from None

    async def list(
        self, prefix: str = "", *, after: str | None = None, page_size: int = LIST_PAGE
    ) -> AsyncIterator[list[ListedObject]]:
        """Pages of the objects under the path `prefix` (whole segments: "blobs/sha256" lists
        blobs/sha256/..., not blobs/sha256x), in key order, starting after key `after`."""
        full_prefix = self._prefix + prefix.strip("/") if prefix.strip("/") else self._prefix
        offset = self._full(after) if after else None
        try:
            stream = obstore.list(
                self._store, full_prefix or None, offset=offset, chunk_size=page_size
            )
            async for page in stream:
                yield [
                    ListedObject(
                        key=self._relative(meta["path"]), size=meta["size"],
                        last_modified=meta["last_modified"], etag=meta.get("e_tag"),
                    )
                    for meta in page
                ]
        except ObjectStoreError:
            raise
        except Exception as exc:
            raise self._error(exc, "list", full_prefix or self.settings.url) from None

    # --- identity -----------------------------------------------------------------------------

    async def read_identity(self) -> str | None:
        """The storage id in PREFIX/arkvory-storage-id, or None if there is none yet."""
        full = self._full(IDENTITY_KEY)
        try:
            result = await obstore.get_async(self._store, full)
            data = bytes(await result.bytes_async())
        except Exception as exc:
            error = self._error(exc, "read the storage id", full)
            if isinstance(error, NotFound):
                await self.check()  # a missing bucket answers a GET with 404 too
                return None
            raise error from None
        return data.decode("utf-8", "replace").strip()

    async def write_identity(self, storage_id: str) -> None:
        """Create PREFIX/arkvory-storage-id (never overwrite): an existing different id is
        another installation's store, Refused."""
        if not storage_id or "\n" in storage_id or len(storage_id) > 200:
            raise ValueError(f"storage_id: expected one short line, got {storage_id!r}")
        full = self._full(IDENTITY_KEY)
        try:
            await obstore.put_async(
                self._store, full, (storage_id + "\n").encode(), mode="create",
                attributes={"Content-Type": "text/plain"},
            )
            return
        except AlreadyExistsError:
            pass
        except Exception as exc:
            raise self._error(exc, "write the storage id", full) from None
        found = await self.read_identity()
        if found != storage_id:
            raise Refused(
                f"{STORAGE_URL}: {self.settings.url} belongs to another installation (storage id"
                f" {found!r}, ours {storage_id!r}); point it at this installation's store",
                setting=STORAGE_URL,
            )

    # --- errors -------------------------------------------------------------------------------

    def _error(self, exc: BaseException, action: str, what: str) -> ObjectStoreError:
        """The library's error as one of ours; never its text (it may quote requests)."""
        return classify(exc, action=action, what=what, settings=self.settings)


def classify(
    exc: BaseException, *, action: str, what: str, settings: ObjectStoreSettings
) -> ObjectStoreError:
    if isinstance(exc, ObjectStoreError):
        return exc
    text = str(exc) if isinstance(exc, (BaseError, OSError)) else ""
    code_match = _S3_CODE.search(text)
    code = code_match.group(1) if code_match else None
    status_match = _STATUS.search(text)
    status = int(status_match.group(1)) if status_match else None
    return _translated(
        code, status, action=action, what=what, settings=settings,
        denied=isinstance(exc, (PermissionDeniedError, UnauthenticatedError)),
        missing=isinstance(exc, (NotFoundError, FileNotFoundError)),
        changed=isinstance(exc, PreconditionError),
        cause=lambda: _cause(exc, text, status),
    )


def classify_answer(
    status: int, body: bytes, *, action: str, what: str, settings: ObjectStoreSettings
) -> ObjectStoreError:
    """An error answer the store sent on a connection of our own (s3_direct.py): its status and
    the S3 error code in the start of its body, translated as `classify` translates obstore's."""
    code_match = _S3_CODE.search(body[:4096].decode("utf-8", "replace"))
    return _translated(
        code_match.group(1) if code_match else None, status, action=action, what=what,
        settings=settings, cause=lambda: f"HTTP {status}",
    )


def _translated(
    code: str | None, status: int | None, *, action: str, what: str, settings: ObjectStoreSettings,
    denied: bool = False, missing: bool = False, changed: bool = False, cause: Any,
) -> ObjectStoreError:
    endpoint = settings.endpoint_url or "AWS S3"
    if code == "NoSuchBucket":
        return Refused(
            f"{STORAGE_URL}: the bucket {settings.bucket!r} does not exist at {endpoint}"
            f" (check {STORAGE_URL} and {ENDPOINT_URL})", setting=STORAGE_URL,
        )
    if denied or code in _CREDENTIAL_CODES or status in (401, 403):
        detail = f" ({code})" if code else ""
        return Refused(
            f"{ACCESS_KEY}: the object store at {endpoint} refused our credentials for"
            f" {settings.url}{detail}; check {ACCESS_KEY} and {SECRET_KEY}",
            setting=ACCESS_KEY,
        )
    if missing or code == "NoSuchKey" or status == 404:
        return NotFound(f"object store: no object {what} in {settings.url}", setting=STORAGE_URL)
    if changed or status == 412:
        return NotFound(f"object store: {what} changed since it was opened", setting=STORAGE_URL)
    return Unavailable(
        f"{ENDPOINT_URL}: the object store at {endpoint} could not {action} {what}"
        f" ({cause()})", setting=ENDPOINT_URL,
    )


def _cause(exc: BaseException, text: str, status: int | None) -> str:
    lowered = text.lower()
    if status is not None:
        return f"HTTP {status}"
    for needle, cause in (
        ("connection refused", "connection refused"),
        ("kind: connect", "cannot connect"),
        ("timed out", "timed out"),
        ("timeout", "timed out"),
        ("connection reset", "connection reset"),
        ("incompletemessage", "connection closed mid-response"),
        ("error decoding response body", "connection closed mid-response"),
        ("unexpected eof", "connection closed mid-response"),
        ("error sending request", "cannot connect"),
    ):
        if needle in lowered:
            return cause
    return type(exc).__name__


def _check_sha256(sha256: str) -> None:
    if not _SHA256.fullmatch(sha256):
        raise ValueError(f"sha256: expected 64 lowercase hex digits, got {sha256!r}")


def _published(stored: ObjectStat, full: str, size: int, sha256: str) -> ObjectStat:
    """The object read back after a publication, if it holds the blob's size and SHA-256."""
    if stored.size != size or stored.sha256 != sha256:
        raise Unavailable(
            f"object store: {full} reads back as {stored.size} bytes with sha256"
            f" {stored.sha256}, not the {size} bytes published (a concurrent writer?)",
            setting=STORAGE_URL,
        )
    return stored


def _stat_of(key: str, meta: Mapping[str, Any], attributes: Mapping[str, str]) -> ObjectStat:
    sha = attributes.get(SHA256_ATTRIBUTE)
    return ObjectStat(
        key=key, size=meta["size"], etag=meta.get("e_tag"), last_modified=meta.get("last_modified"),
        sha256=sha if sha and _SHA256.fullmatch(sha) else None,
    )


# --- publishing while an upload arrives -------------------------------------------------------


class Publication:
    """The bytes of a blob sent to the store as they arrive (the writer's upload parts, each
    once it is on disk, in order), as one multipart upload straight to the final key with the
    SHA-256 the upload declared as metadata. Nothing is visible before `complete`, which the
    caller calls only once the whole file's digest is checked and matches; `abandon` (or simply
    dropping it) leaves an incomplete multipart upload, invisible, which cleanup aborts once no
    open session owns it (obstore cannot: s3_multipart.py does; the bucket's
    AbortIncompleteMultipartUpload rule is the second line). Memory: obstore's
    buffer of PART_SIZE plus PUT_CONCURRENCY parts in flight; `write` waits while they are.
    obstore keeps the buffer given to `write` as it is (no copy) until its part is sent: the
    caller must not change it while any view of it is alive (cache_files.py `BufferPool`,
    which the writer's UPLOAD_BUFFERS is, reuses a buffer only then).
    """

    def __init__(self, store: ObjectStore, key: str, sha256: str, size: int) -> None:
        self._store = store
        self.key = key
        self.sha256 = sha256
        self.size = size
        self.sent = 0
        self._full = store._full(key)
        self._writer: Any = obstore.open_writer_async(
            store._store, self._full,
            attributes={"Content-Type": "application/octet-stream", SHA256_ATTRIBUTE: sha256},
            buffer_size=PART_SIZE, max_concurrency=PUT_CONCURRENCY,
        )

    async def write(self, buffer: Any) -> None:
        """Send the next bytes (in order); a store that fails raises a StorageError, after
        which this publication is abandoned."""
        writer = self._writer
        if writer is None:
            raise Unavailable(f"object store: the publication of {self._full} was abandoned", setting=ENDPOINT_URL)
        size = len(memoryview(buffer))
        if self.sent + size > self.size:
            raise ValueError(f"buffer: {self.sent + size} bytes is more than the blob's {self.size}")
        try:
            await writer.write(buffer)
        except Exception as exc:
            self._writer = None
            raise self._store._error(exc, "publish", self._full) from None
        self.sent += size

    async def complete(self) -> ObjectStat:
        """Make the object visible (CompleteMultipartUpload, or one PUT when it is small) and
        read it back: size and SHA-256 must be the blob's."""
        writer, self._writer = self._writer, None
        if writer is None or self.sent != self.size:
            raise Unavailable(
                f"object store: the publication of {self._full} is not whole ({self.sent} of {self.size} bytes)",
                setting=ENDPOINT_URL,
            )
        try:
            await writer.close()
        except Exception as exc:
            raise self._store._error(exc, "publish", self._full) from None
        return _published(await self._store.stat(self.key), self._full, self.size, self.sha256)

    def abandon(self) -> None:
        self._writer = None  # dropped unclosed: nothing becomes visible

    @property
    def abandoned(self) -> bool:
        return self._writer is None


# --- reading a range --------------------------------------------------------------------------


class RangeReader:
    """Bytes [start, start + length) of one object, as zero-copy buffers.

        async with store.open_range(key, 0, size) as reader:
            async for buffer in reader:          # obstore.Bytes: memoryview(buffer) copies nothing
                transport.write(memoryview(buffer))

    or `await reader.readinto(buf)` to fill a caller's buffer (one copy). Each buffer holds at
    least `chunk_size` bytes except the last: about one Python call per chunk_size bytes.
    Leaving the block early (an exception, a cancellation, `aclose`) drops the HTTP response:
    its connection is closed, not returned to the pool half-read. The reader never ends short:
    fewer bytes than asked for raise Unavailable, never a silent truncation.
    """

    def __init__(self, store: ObjectStore, key: str, start: int, length: int, *,
                 chunk_size: int, if_match: str | None) -> None:
        self._store = store
        self.key = key
        self.start = start
        self.length = length
        self._chunk_size = max(1, chunk_size)
        self._if_match = if_match
        self._stream: Any = None
        self._pending: memoryview | None = None
        self._received = 0
        self._closed = False
        self.stat: ObjectStat | None = None  # known once opened

    @property
    def received(self) -> int:
        return self._received

    async def __aenter__(self) -> RangeReader:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def open(self) -> None:
        """Send the GET; NotFound / Refused / Unavailable surface here, before any byte."""
        if self._stream is not None or self._closed:
            return
        full = self._store._full(self.key)
        if self.length == 0:
            self._stream = _EMPTY
            return
        options: dict[str, Any] = {"range": (self.start, self.start + self.length)}
        if self._if_match:
            options["if_match"] = self._if_match
        try:
            result = await obstore.get_async(self._store._stream_store, full, options=options)
        except Exception as exc:
            raise self._store._error(exc, "read", full) from None
        got_range = tuple(result.range)
        if got_range != (self.start, self.start + self.length):
            raise Unavailable(
                f"object store: {full} answered bytes {got_range[0]}-{got_range[1]} for"
                f" {self.start}-{self.start + self.length} (the object is shorter than recorded?)",
                setting=STORAGE_URL,
            )
        self.stat = _stat_of(self.key, result.meta, result.attributes)
        self._stream = result.stream(min_chunk_size=self._chunk_size)

    def __aiter__(self) -> RangeReader:
        return self

    async def __anext__(self) -> Any:
        if self._pending is not None:
            view, self._pending = self._pending, None
            return view
        buffer = await self._next_buffer()
        if buffer is None:
            raise StopAsyncIteration
        return buffer

    async def readinto(self, buffer: Any) -> int:
        """Fill up to len(buffer) bytes; 0 at the end of the range."""
        target = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(target):
            if self._pending is None:
                chunk = await self._next_buffer()
                if chunk is None:
                    break
                self._pending = memoryview(chunk).cast("B")
            take = min(len(self._pending), len(target) - filled)
            target[filled:filled + take] = self._pending[:take]
            self._pending = self._pending[take:] if take < len(self._pending) else None
            filled += take
        return filled

    async def _next_buffer(self) -> Any:
        if self._closed:
            raise Unavailable(f"object store: the read of {self.key} was closed",
                              setting=ENDPOINT_URL)
        if self._stream is None:
            await self.open()
        if self._stream is _EMPTY:
            return None
        full = self._store._prefix + self.key
        try:
            buffer = await self._stream.__anext__()
        except StopAsyncIteration:
            if self._received != self.length:
                await self.aclose()
                raise Unavailable(
                    f"object store: the read of {full} ended after {self._received} of"
                    f" {self.length} bytes", setting=ENDPOINT_URL,
                ) from None
            return None
        except Exception as exc:
            await self.aclose()
            raise self._store._error(exc, "finish reading", full) from None
        self._received += len(memoryview(buffer))
        if self._received > self.length:
            await self.aclose()
            raise Unavailable(f"object store: the read of {full} sent more than asked for",
                              setting=ENDPOINT_URL)
        return buffer

    async def aclose(self) -> None:
        """Cut the transfer: the response is dropped and its connection closed."""
        self._closed = True
        self._pending = None
        self._stream = None  # obstore's stream owns the response; dropping it closes it


_EMPTY = object()
