"""Re-hashing blobs on an object store for the verify task (verify.py): the counterpart of
rehash.py's FileCheck, by a streaming range GET.

One HEAD first says whether the object is there and has the recorded size (a missing object
or a wrong size decides without reading); then one GET, pinned to the HEAD's ETag (`If-Match`),
is hashed a piece at a time so that the task can pace and cancel between pieces. The hashing of
each buffer runs in a worker thread (hashlib releases the GIL), so the event loop stays free.
A failure of the store itself is not a finding about the blob: StorageUnavailable is raised and
the task fails (its retry policy decides what next).
"""

from __future__ import annotations

import hashlib
from typing import Any

import anyio.to_thread

from arkvory.shared.storage import BlobNotFound, BlobStorage

from .rehash import Found

THREAD_MIN_BYTES = 256 * 1024  # smaller buffers are hashed on the loop: a thread hop costs more


class ObjectCheck:
    """One object being re-hashed; used from one task."""

    def __init__(self, storage: BlobStorage, sha256: str, size: int, *, chunk_size: int) -> None:
        self.storage = storage
        self.sha256 = sha256
        self.size = size
        self.done = 0  # bytes hashed so far
        self.version: str | None = None
        self._chunk_size = chunk_size
        self._reader: Any = None
        self._digest = hashlib.sha256()

    async def open(self) -> Found | None:
        """A Found when the HEAD already decides (missing, wrong size); else start the GET."""
        stat = await self.storage.stat(self.sha256)
        if stat is None:
            return Found("missing", f"no object for {self.sha256} in {self.storage.location}")
        self.version = stat.version
        if stat.size != self.size:
            return Found("corrupt", f"{stat.size} bytes stored, {self.size} recorded", version=self.version)
        if self.size == 0:
            return self._verdict()
        reader = self.storage.open_range(
            self.sha256, 0, self.size, chunk_size=self._chunk_size, if_match=self.version
        )
        try:
            await reader.__aenter__()
        except BlobNotFound:
            # Gone or replaced since the HEAD: verify.py looks again under the digest's claim.
            return Found("missing", f"no object for {self.sha256} in {self.storage.location}")
        self._reader = reader
        return None

    async def hash(self, limit: int) -> Found | None:
        """Hash at least `limit` more bytes (whole buffers); a Found once the object is done."""
        assert self._reader is not None
        target = min(self.size, self.done + max(1, limit))
        while self.done < target:
            try:
                buffer = await self._reader.__anext__()
            except BlobNotFound:
                return Found("missing", f"the object for {self.sha256} changed while it was read")
            except StopAsyncIteration:
                break
            view = memoryview(buffer)
            if len(view) >= THREAD_MIN_BYTES:
                await anyio.to_thread.run_sync(self._digest.update, view)
            else:
                self._digest.update(view)
            self.done += len(view)
        if self.done < self.size:
            return None
        return self._verdict()

    def _verdict(self) -> Found:
        actual = self._digest.hexdigest()
        if actual != self.sha256:
            return Found("corrupt", f"the bytes hash to {actual}", version=self.version)
        return Found(None, version=self.version)

    async def close(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            await reader.aclose()

    async def whole(self) -> Found:
        try:
            found = await self.open()
            if found is None:
                found = await self.hash(self.size)
            assert found is not None
            return found
        finally:
            await self.close()
