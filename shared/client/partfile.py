"""`NAME.part`: the file a download grows, hashed and written in threads of their own.

The receiving loop only reads batches; one thread hashes them and another writes them, each in
order (hashlib and os.write release the GIL), at most `DEPTH` batches behind, so neither the
SHA-256 nor the page cache's pace holds up the socket, and the two overlap each other. The strong ETag
the bytes belong to is kept beside the file (`NAME.part.etag`): a later run continues the file
only if the server still has it.

Durability is opt-in (`durable=True`), as with curl and wget: by default the verified file is
renamed into place and the kernel writes it back when it will, so a download is not held to
the disk's write speed (~2.8 s per GiB on the project's test host) but a power cut soon after
it may lose the file's bytes. Durable, a third thread flushes what is written every FLUSH_EVERY
bytes (the disk works during the transfer), then the file is fsynced before the rename and the
directory after it.

The .part is created by `open()` (so an unwritable place fails before anything is asked of the
network), never its parent directories; a .part this run created that is still empty when the
download fails is removed again (`abandon()`): nothing in it to resume.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import os
import pathlib
from collections.abc import Callable
from typing import Any

from .errors import LocalIOError

DEPTH = 8  # batches queued behind the receiver; bounds memory at (DEPTH + 1) × BATCH
BATCH = 4 * 1024 * 1024  # bytes read into one buffer before it goes to the two threads
FLUSH_EVERY = 32 * 1024 * 1024
HASH_READ = 8 * 1024 * 1024


class PartFile:
    """The partial download: its length, the SHA-256 of its bytes, the ETag they came from."""

    def __init__(self, dest: pathlib.Path, *, durable: bool = False) -> None:
        self.dest = dest
        self.durable = durable
        self._created = False  # this run made the .part (then an empty one is not left behind)
        self.path = dest.with_name(dest.name + ".part")
        self.etag_path = dest.with_name(dest.name + ".part.etag")
        self.length = 0
        self.etag: str | None = None
        self._digest = hashlib.sha256()
        self._pending: collections.deque[tuple[tuple[concurrent.futures.Future[Any], ...], memoryview | None]] = (
            collections.deque()
        )
        # Buffers whose bytes are written and hashed, to read the next batches into: fresh ones
        # would cost a page fault per 4 KiB (a second per GiB on a small VM).
        self._free: list[memoryview] = []
        self._written = 0  # file offset of the next write (worker thread)
        # Durable only: an fdatasync in a third thread every FLUSH_EVERY bytes, so the disk works
        # while bytes still arrive and the fsync before the rename has little left to wait for.
        self._flusher = (
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="arkvory-part-flush") if durable else None
        )
        self._flushing: concurrent.futures.Future[Any] | None = None
        self._flushed_at = 0
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="arkvory-part-write")
        self._hasher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="arkvory-part-hash")
        self._fd = -1

    def open(self) -> None:
        """Open (or create) the .part file; keep what an earlier run left if its ETag is known.
        The directory must exist (like curl without --create-dirs): a missing one is named."""
        try:
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                self._created = True
            except FileExistsError:
                self._fd = os.open(self.path, os.O_RDWR)
            etag = self.etag_path.read_text().strip() if self.etag_path.exists() else ""
        except FileNotFoundError:
            raise LocalIOError(
                f"cannot write {self.dest}: the directory {self.dest.parent} does not exist"
            ) from None
        except OSError as exc:
            raise LocalIOError(f"cannot open {self.path}: {exc.strerror or exc}") from None
        if etag:
            self.etag = etag
            self._call(self._hash_existing)
        else:
            self._call(self._truncate)

    def start_over(self, etag: str | None) -> None:
        """Empty the file: the bytes that come next belong to `etag` (never spliced)."""
        self.drain()
        self._call(self._truncate)
        self.remember(etag)

    def remember(self, etag: str | None) -> None:
        if etag == self.etag:
            return
        self.etag = etag
        try:
            if etag:
                self.etag_path.write_text(etag + "\n")
            else:
                self.etag_path.unlink(missing_ok=True)
        except OSError as exc:
            raise LocalIOError(f"cannot write {self.etag_path}: {exc.strerror or exc}") from None

    def batch_buffer(self) -> memoryview:
        """A BATCH-sized buffer to read the next bytes into (then `write(buffer[:n], buffer)`)."""
        return self._free.pop() if self._free else memoryview(bytearray(BATCH))

    def write(self, data: bytes | memoryview, buffer: memoryview | None = None) -> None:
        """Queue `data` after what is there; it must not change until written and hashed, and
        `buffer` (the one it lies in, if from `batch_buffer`) is reused after that. Blocks only
        when DEPTH batches are waiting."""
        self.length += len(data)
        futures = (self._worker.submit(self._append, data), self._hasher.submit(self._digest.update, data))
        self._pending.append((futures, buffer))
        if (
            self._flusher is not None
            and self.length - self._flushed_at >= FLUSH_EVERY
            and (self._flushing is None or self._flushing.done())
        ):
            self._flushed_at = self.length
            self._flushing = self._flusher.submit(_flush_quietly, self._fd)
        while len(self._pending) > DEPTH:
            self._wait(self._pending.popleft())

    def drain(self) -> None:
        """Wait until every queued byte is written and hashed (raises the first write error)."""
        while self._pending:
            self._wait(self._pending.popleft())

    def _wait(self, entry: tuple[tuple[concurrent.futures.Future[Any], ...], memoryview | None]) -> None:
        futures, buffer = entry
        for future in futures:
            future.result()
        if buffer is not None:
            self._free.append(buffer)

    def hexdigest(self) -> str:
        self.drain()
        return self._digest.hexdigest()

    def finish(self) -> None:
        """Rename into place atomically; durable, fsync the file first and the directory after."""
        self.drain()
        self._stop_flushing()
        if self.durable:
            self._call(os.fsync, self._fd)
        self._close_fd()
        try:
            os.replace(self.path, self.dest)
            self.etag_path.unlink(missing_ok=True)
            if self.durable:
                directory = os.open(self.dest.parent, os.O_RDONLY)
                try:
                    os.fsync(directory)
                finally:
                    os.close(directory)
        except OSError as exc:
            raise LocalIOError(f"cannot move {self.path} to {self.dest}: {exc.strerror or exc}") from None

    def abandon(self) -> None:
        """The download failed: close, and remove the .part (and its ETag) if this run created
        it and no byte arrived (a 404, a 401, no server): nothing to resume. A .part with bytes,
        or one an earlier run left, stays for the next run to continue."""
        self.close()
        if self._created and self.length == 0:
            for path in (self.path, self.etag_path):
                try:
                    path.unlink(missing_ok=True)
                except OSError:
                    pass  # the download's own error is what the caller needs to see

    def discard(self) -> None:
        """Remove the .part and its ETag (after an integrity failure: nothing to resume)."""
        self.close()
        for path in (self.path, self.etag_path):
            path.unlink(missing_ok=True)

    def close(self) -> None:
        try:
            self.drain()
        except LocalIOError:
            pass
        self._stop_flushing()
        self._close_fd()
        self._worker.shutdown(wait=True)
        self._hasher.shutdown(wait=True)

    def _stop_flushing(self) -> None:
        """No early flush may still use the descriptor when it is closed."""
        if self._flusher is not None:
            self._flusher.shutdown(wait=True)

    # -- in the worker thread ------------------------------------------------------------------

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._worker.submit(fn, *args).result()

    def _append(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        start = self._written
        try:
            while view:
                view = view[os.write(self._fd, view):]
            self._written = start + len(data)
        except OSError as exc:
            raise LocalIOError(f"cannot write {self.path}: {exc.strerror or exc}") from None

    def _truncate(self) -> None:
        self._flushed_at = 0
        try:
            os.ftruncate(self._fd, 0)
            os.lseek(self._fd, 0, os.SEEK_SET)
        except OSError as exc:
            raise LocalIOError(f"cannot truncate {self.path}: {exc.strerror or exc}") from None
        self._digest = hashlib.sha256()
        self.length = self._written = 0

    def _hash_existing(self) -> None:
        """A resumed .part: hash what is there, so the final digest covers the whole file."""
        digest, length = hashlib.sha256(), 0
        try:
            os.lseek(self._fd, 0, os.SEEK_SET)
            while chunk := os.read(self._fd, HASH_READ):
                digest.update(chunk)
                length += len(chunk)
        except OSError as exc:
            raise LocalIOError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        self._digest, self.length = digest, length
        self._written = length

    def _close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _flush_quietly(fd: int) -> None:
    """An early flush only saves time later: its failure shows up in the final fsync."""
    try:
        os.fdatasync(fd)
    except OSError:
        pass
