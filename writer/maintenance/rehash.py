"""Re-hashing stored blob files for the verify task (verify.py), in worker threads.

A thread hop costs more than hashing a small file, so small files are checked whole, many per
hop (`check_whole`); a large one is opened once and hashed a piece per hop (`FileCheck.hash`),
so the task can pace and cancel between pieces. Reads are READ_BYTES into one reused buffer,
and hashlib releases the GIL for each of them, so the event loop (and the downloads of a
process running it) keep going.

A check ends in a `Found`: the bytes are right, or the file is missing, or it is corrupt (wrong
size, wrong bytes, or an I/O error of the medium). Any other OSError (too many open files,
permissions) is the operator's to fix and is raised as it is.
"""

from __future__ import annotations

import errno
import hashlib
import os
from dataclasses import dataclass

READ_BYTES = 1024 * 1024


@dataclass
class Found:
    problem: str | None  # None: the bytes are right; else "missing" or "corrupt"
    detail: str = ""
    stat: os.stat_result | None = None  # the file that was read (quarantine moves only that one)
    version: str | None = None  # the object that was read, by ETag (rehash_objects.py)


def hash_span(fd: int, digest, buffer: memoryview, limit: int) -> int:
    """Hash up to `limit` bytes from `fd`'s position; the number hashed (fewer at end of file)."""
    done = 0
    while done < limit:
        n = os.readv(fd, [buffer[: min(len(buffer), limit - done)]])
        if n == 0:
            break
        digest.update(buffer[:n])
        done += n
    return done


class FileCheck:
    """One blob file being re-hashed. Its methods run in worker threads, one at a time."""

    def __init__(self, path: str, sha256: str, size: int) -> None:
        self.path = path
        self.sha256 = sha256
        self.size = size
        self.done = 0  # bytes hashed so far
        self.fd: int | None = None
        self.stat: os.stat_result | None = None
        self._digest = hashlib.sha256()

    def open(self) -> Found | None:
        """Open the file; a Found when that already decides (missing, wrong size, unreadable)."""
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return Found("missing", f"no file at {self.path}")
        except OSError as exc:
            return _medium_failed(exc, "cannot be opened", None)
        self.stat = os.fstat(self.fd)
        if self.stat.st_size != self.size:
            return Found("corrupt", f"{self.stat.st_size} bytes on disk, {self.size} recorded", self.stat)
        if self.size > READ_BYTES:
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        return None

    def hash(self, limit: int, buffer: memoryview) -> Found | None:
        """Hash the next `limit` bytes; a Found once the file is done (or turns out short)."""
        assert self.fd is not None
        try:
            n = hash_span(self.fd, self._digest, buffer, limit)
        except OSError as exc:
            return _medium_failed(exc, f"read error at byte {self.done}", self.stat)
        self.done += n
        if n < limit:
            return Found("corrupt", f"shorter than recorded: ended at byte {self.done} of {self.size}", self.stat)
        if self.done < self.size:
            return None
        actual = self._digest.hexdigest()
        if actual != self.sha256:
            return Found("corrupt", f"the bytes hash to {actual}", self.stat)
        return Found(None, stat=self.stat)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def whole(self, buffer: memoryview) -> Found:
        try:
            found = self.open()
            if found is None:
                found = self.hash(self.size - self.done, buffer)
            assert found is not None
            return found
        finally:
            self.close()


def check_whole(checks: list[FileCheck], buffer: memoryview) -> list[Found]:
    """Check several (small) files in one thread hop."""
    return [check.whole(buffer) for check in checks]


def _medium_failed(exc: OSError, where: str, stat: os.stat_result | None) -> Found:
    if exc.errno != errno.EIO:
        raise exc
    return Found("corrupt", f"{where}: {exc.strerror}", stat)
