"""`NAME.part`: the file a download grows, written by the receiving thread as curl writes it,
and hashed in a thread of its own.

The receiving loop reads BATCH bytes into a buffer, writes them to the file itself (one
`os.write`, as `curl -o` does) and hands the buffer to the hashing thread (hashlib releases the
GIL), which gives it back once hashed; at most DEPTH buffers are out. So the SHA-256 runs beside
the socket and the page cache instead of after them, and every byte is still in the CPU's cache
when it is hashed: 1 MiB buffers, not 4 MiB ones. Issue 14 §3 measured the earlier design (a
writing thread and a hashing thread behind a receiving one, 4 MiB batches) at 0.42× `curl -o`
for 512 MiB through the CLI: three busy threads beside the server on two cores, each byte
fetched from memory twice. Receiving and writing in one thread and hashing in another:
0.8-1.0× (docs/performance.md).

A .part this run creates is never truncated: ext4 (auto_da_alloc) flushes a file on close once
it was truncated to 0, which cost ~0.12 s per 512 MiB in the close and started the disk
writing during the transfer. The strong ETag the bytes belong to is kept beside the file
(`NAME.part.etag`): a later run continues the file only if the server still has it.

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

import concurrent.futures
import hashlib
import os
import pathlib
import queue
import threading
from typing import Any

from .errors import LocalIOError

DEPTH = 8  # buffers handed to the hashing thread and not yet back; memory is DEPTH × BATCH
BATCH = 1024 * 1024  # bytes received into one buffer (fits a CPU's L2/L3 while it is hashed)
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
        self._hasher = _Hasher()
        # Buffers to receive into: fresh ones would cost a page fault per 4 KiB.
        self._free: list[memoryview] = []
        self._buffers = 0  # made so far, at most DEPTH
        # Durable only: an fdatasync in a thread every FLUSH_EVERY bytes, so the disk works
        # while bytes still arrive and the fsync before the rename has little left to wait for.
        self._flusher = (
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="arkvory-part-flush") if durable else None
        )
        self._flushing: concurrent.futures.Future[Any] | None = None
        self._flushed_at = 0
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
            self._hash_existing()
        elif not self._created:
            self._truncate()  # bytes of an unknown ETag: never continued

    def start_over(self, etag: str | None) -> None:
        """Empty the file: the bytes that come next belong to `etag` (never spliced)."""
        self.drain()
        if self.length:
            self._truncate()
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
        """A BATCH-sized buffer to read the next bytes into (then `write(buffer[:n], buffer)`);
        waits for the hashing thread to give one back when DEPTH are out."""
        if self._free:
            return self._free.pop()
        if self._buffers < DEPTH or not self._hasher.out:
            self._buffers += 1
            return memoryview(bytearray(BATCH))
        return self._hasher.returned()

    def unused(self, buffer: memoryview) -> None:
        """Give back a buffer from `batch_buffer` that received nothing."""
        self._free.append(buffer)

    def write(self, data: bytes | memoryview, buffer: memoryview | None = None) -> None:
        """Append `data` to the file now and queue it for hashing: it must not change until
        hashed, and `buffer` (the one it lies in, if from `batch_buffer`) comes back after that."""
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as exc:
            raise LocalIOError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        self.length += len(data)
        self._hasher.hash(self._digest, data, buffer)
        if (
            self._flusher is not None
            and self.length - self._flushed_at >= FLUSH_EVERY
            and (self._flushing is None or self._flushing.done())
        ):
            self._flushed_at = self.length
            self._flushing = self._flusher.submit(_flush_quietly, self._fd)

    def drain(self) -> None:
        """Wait until every written byte is hashed (the buffers are then all free)."""
        self._free.extend(self._hasher.wait_all())

    def hexdigest(self) -> str:
        self.drain()
        self._hasher.raise_failure()
        return self._digest.hexdigest()

    def finish(self) -> None:
        """Rename into place atomically; durable, fsync the file first and the directory after."""
        self.drain()
        self._stop_flushing()
        if self.durable:
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise LocalIOError(f"cannot write {self.path}: {exc.strerror or exc}") from None
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
        self._hasher.stop()
        self._stop_flushing()
        self._close_fd()

    def _stop_flushing(self) -> None:
        """No early flush may still use the descriptor when it is closed."""
        if self._flusher is not None:
            self._flusher.shutdown(wait=True)

    def _truncate(self) -> None:
        self._flushed_at = 0
        try:
            os.ftruncate(self._fd, 0)
            os.lseek(self._fd, 0, os.SEEK_SET)
        except OSError as exc:
            raise LocalIOError(f"cannot truncate {self.path}: {exc.strerror or exc}") from None
        self._digest = hashlib.sha256()
        self.length = 0

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

    def _close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _Hasher:
    """One thread that hashes what it is handed, in order, and hands the buffers back.

    Plain queues rather than an executor: a hand-over costs a few microseconds, not a Future
    and its condition variable per batch."""

    def __init__(self) -> None:
        self._todo: queue.SimpleQueue[tuple[Any, Any, memoryview | None] | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[memoryview | None] = queue.SimpleQueue()
        self.out = 0  # handed over, not yet given back
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    def hash(self, digest: Any, data: bytes | memoryview, buffer: memoryview | None) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="arkvory-part-hash", daemon=True)
            self._thread.start()
        self._todo.put((digest, data, buffer))
        self.out += 1

    def returned(self) -> memoryview:
        """The next buffer given back (waits for it); only call with a buffer out."""
        while self.out:
            self.out -= 1
            buffer = self._done.get()
            if buffer is not None:
                return buffer
        raise RuntimeError("no buffer is out to wait for")

    def wait_all(self) -> list[memoryview]:
        """Wait until everything handed over is hashed; the buffers that came back."""
        buffers = []
        while self.out:
            self.out -= 1
            buffer = self._done.get()
            if buffer is not None:
                buffers.append(buffer)
        return buffers

    def raise_failure(self) -> None:
        if self._failure is not None:
            raise LocalIOError(f"hashing the download failed: {self._failure!r}")

    def stop(self) -> None:
        if self._thread is not None:
            self.wait_all()
            self._todo.put(None)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        todo, done = self._todo, self._done
        while (item := todo.get()) is not None:
            digest, data, buffer = item
            try:
                digest.update(data)
            except BaseException as exc:  # reported by hexdigest(); the buffers still come back
                self._failure = self._failure or exc
            done.put(buffer)


def _flush_quietly(fd: int) -> None:
    """An early flush only saves time later: its failure shows up in the final fsync."""
    try:
        os.fdatasync(fd)
    except OSError:
        pass
