"""The read cache's files on disk (read_cache.py): a fill's file written with O_DIRECT, the
reading back of a file with O_DIRECT to hash it, in the fill's worker threads, the fill's
reusable page-aligned buffers (`BufferPool`, in transparent huge pages where the host allows), and
the scheduling of the fill's hashing thread (`lower_priority`).

Why direct I/O both ways: on this kind of host a page-cache write of 1 GiB costs 0.4-1.9 CPU s of
reclaim and copying and a buffered read-and-hash ~2 CPU s, against ~0.05 and ~0.6 (the SHA-256
itself) direct (docs/performance.md, issue 16). Where the filesystem refuses O_DIRECT (tmpfs),
both fall back to ordinary I/O.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import mmap
import os
import threading
from collections.abc import Callable
from typing import Any

from .local import is_out_of_space

KiB, MiB = 1024, 1024 * 1024
# A fill writes the file with O_DIRECT, STAGE bytes at a time.
STAGE = 8 * MiB
HASH_READ = 8 * MiB  # bytes per direct read of a file being hashed
ALIGN = 4096  # O_DIRECT offsets and sizes: a multiple of the logical block size (512 or 4096)
# The nice value of a fill's hashing thread: the hash trails the fill, so the downloads that
# stream along with it get the CPU first (read_cache.py says why that is safe). Not SCHED_IDLE:
# a thread of that class that is preempted while it holds the GIL may wait for as long as the
# host stays busy, and every thread of the process (the event loop, the lease) would wait with it.
HASH_NICE = 10


def lower_priority() -> None:
    """A thread initializer: run this thread at HASH_NICE (never raise its priority)."""
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, max(os.getpriority(os.PRIO_PROCESS, tid), HASH_NICE))
    except (OSError, AttributeError):
        pass  # not Linux, or not allowed: the hash simply runs at the process's priority


def huge_buffer(size: int) -> mmap.mmap:
    """A page-aligned buffer of `size` bytes in private anonymous memory, with transparent huge
    pages asked for (THP in `madvise` mode, as here). O_DIRECT pins every page it writes from:
    1 GiB from 4 MiB buffers in 4 KiB pages cost 0.11-0.14 CPU s here, in huge pages 0.04-0.06.
    Python's default anonymous map is shared memory, which THP leaves alone (`shmem_enabled`
    is `never` by default): hence MAP_PRIVATE."""
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    buffer = mmap.mmap(-1, size, flags=flags) if flags else mmap.mmap(-1, size)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            buffer.madvise(advice)
        except OSError:
            pass  # no THP here: ordinary pages
    return buffer


def shared_buffer(size: int) -> mmap.mmap:
    """A page-aligned buffer of `size` bytes in Python's default anonymous map (no huge pages)."""
    return mmap.mmap(-1, size)


class BufferPool:
    """Page-aligned buffers of `size` bytes, each used again once nothing refers to it any more:
    no view of it alive (a fill's readers, the hash, the disk thread, a view a transport or an
    object-store publication still holds: obstore takes the bytes without a copy). Fresh memory
    for every buffer costs this host ~0.4 CPU s/GiB of page faults and zeroing; a reused buffer
    none. A buffer in use is never handed out. With `keep`, at most that many stay allocated
    (more in use at once are made fresh and dropped after use); without, the pool holds as many
    as are in use at once. `allocate` makes a buffer (`huge_buffer` for O_DIRECT writes)."""

    def __init__(
        self, size: int, *, keep: int | None = None, allocate: Callable[[int], mmap.mmap] = huge_buffer
    ) -> None:
        self.size = size
        self.keep = keep
        self._allocate = allocate
        self._buffers: list[mmap.mmap] = []

    def take(self) -> memoryview:
        for buffer in self._buffers:
            if buffer_unreferenced(buffer):
                return memoryview(buffer)
        buffer = self._allocate(self.size)
        if self.keep is None or len(self._buffers) < self.keep:
            self._buffers.append(buffer)
        return memoryview(buffer)

    def __len__(self) -> int:
        return len(self._buffers)


def buffer_unreferenced(buffer: mmap.mmap) -> bool:
    """No view of `buffer` is alive: CPython refuses to resize a map while any is (BufferError),
    and resizing it to its own size changes nothing else."""
    try:
        buffer.resize(len(buffer))
    except BufferError:
        return False
    return True


def _open_direct(path: str, flags: int, mode: int = 0o600) -> tuple[int, bool]:
    """`path` opened with O_DIRECT where the platform and the filesystem allow it, else without
    (tmpfs may refuse it); returns the descriptor and whether it is direct."""
    direct = getattr(os, "O_DIRECT", 0)
    if direct:
        try:
            return os.open(path, flags | direct, mode), True
        except OSError:
            pass  # a filesystem without O_DIRECT: ordinary I/O
    return os.open(path, flags, mode), False


def _drop_direct(fd: int) -> None:
    """Ordinary I/O on `fd` from now on: its filesystem refused a direct transfer after all."""
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)


class FillFile:
    """A fill's file, written in worker threads: O_DIRECT from a page-aligned staging buffer
    where the filesystem allows it (the tail, not a whole block, is written buffered), else
    ordinary writes. Space for the whole blob is allocated first."""

    def __init__(self, path: str, size: int) -> None:
        self.fd, self.direct = _open_direct(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC)
        if size:
            try:
                os.posix_fallocate(self.fd, 0, size)
            except OSError as exc:
                if is_out_of_space(exc):
                    os.close(self.fd)
                    raise
                # Any other refusal (a filesystem without fallocate): the writes allocate as they
                # go, and a full disk fails one of them instead (the fill fails, its readers go
                # on from the store).
        self._stage = huge_buffer(STAGE)  # page-aligned, as O_DIRECT wants
        self._staged = 0
        self._view = memoryview(self._stage)

    def write(self, view: memoryview, *, aligned: bool = False) -> int:
        """Write `view` (staged when needed); returns how many bytes reached the file. `aligned`:
        `view` starts on a page (a BufferPool buffer), so a whole number of blocks goes to the disk
        as it is, with nothing staged before it: no copy."""
        if aligned and self.direct and not self._staged and len(view) % ALIGN == 0:
            done = 0
            while done < len(view):
                try:
                    done += os.write(self.fd, view[done:])
                except OSError as exc:
                    if not self.direct or exc.errno != errno.EINVAL:
                        raise
                    self._buffered()  # the filesystem refuses direct writes after all
            return done
        written = 0
        taken = 0
        while taken < len(view):
            room = STAGE - self._staged
            piece = min(room, len(view) - taken)
            self._view[self._staged:self._staged + piece] = view[taken:taken + piece]
            self._staged += piece
            taken += piece
            if self._staged == STAGE:
                written += self._flush()
        return written

    def finish(self) -> int:
        """Write what is staged (a partial block: not direct); returns how many bytes."""
        if self.direct and self._staged % mmap.PAGESIZE:
            self._buffered()
        return self._flush()

    def _flush(self) -> int:
        staged, done = self._staged, 0
        while done < staged:
            try:
                done += os.write(self.fd, self._view[done:staged])
            except OSError as exc:
                if not self.direct or exc.errno != errno.EINVAL:
                    raise
                self._buffered()  # the filesystem refuses direct writes after all
        self._staged = 0
        return staged

    def _buffered(self) -> None:
        _drop_direct(self.fd)
        self.direct = False

    def close(self) -> None:
        self._view.release()
        self._stage.close()
        os.close(self.fd)


class DirectReader:
    """Reads a file into the SHA-256 being computed, with O_DIRECT where allowed: the bytes go
    from the disk to an aligned buffer, past the page cache. For one worker thread at a time."""

    def __init__(self, path: str) -> None:
        self.fd, self.direct = _open_direct(path, os.O_RDONLY | os.O_CLOEXEC)
        self._buffer = huge_buffer(HASH_READ + ALIGN)
        self._view = memoryview(self._buffer)

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def hash_range(self, digest: Any, start: int, end: int) -> int:
        """Add bytes [start, end) of the file (at most HASH_READ of them) to `digest`; returns
        how many (0 when the file ends at `start`)."""
        first = start - start % ALIGN if self.direct else start
        count = min(end - first, HASH_READ + (start - first))
        wanted = -(-count // ALIGN) * ALIGN if self.direct else count
        got = self._read(first, wanted)
        usable = min(got, count) - (start - first)
        if usable <= 0:
            return 0
        digest.update(self._view[start - first:start - first + usable])
        return usable

    def _read(self, offset: int, size: int) -> int:
        while True:
            try:
                return os.preadv(self.fd, [self._view[:size]], offset)
            except OSError as exc:
                if not self.direct or exc.errno != errno.EINVAL:
                    raise
                _drop_direct(self.fd)
                self.direct = False

    def close(self) -> None:
        self._view.release()
        self._buffer.close()
        os.close(self.fd)


def file_matches(path: str, sha256: str, size: int) -> bool:
    """Whether the file at `path` has `size` bytes whose SHA-256 is `sha256` (a worker thread)."""
    try:
        reader = DirectReader(path)
    except FileNotFoundError:
        return False
    try:
        if reader.size() != size:
            return False
        digest = hashlib.sha256()
        done = 0
        while done < size:
            got = reader.hash_range(digest, done, size)
            if not got:
                return False
            done += got
    finally:
        reader.close()
    return digest.hexdigest() == sha256
