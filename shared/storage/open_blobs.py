"""Blob files kept open between downloads of the same content.

Opening a blob resolves four directories, a noticeable share of a small download. Blobs are
content-addressed and immutable, so a descriptor kept open serves the right bytes for as long as
it is open, even if the file is unlinked meanwhile (a transfer starts only after the catalog
lookup found its artifact, and holds a read pin while it streams). At most `capacity` blobs are
kept, and none much longer than `idle_s` after its last use (idle ones are looked for on an
acquire, at most every `idle_s` / 10: not on every one, which cost each small download a
Python loop), so a blob that cleanup deleted does not keep its disk space for long; one still
in use when it is pushed out is closed by its last user.

A blob the verify task quarantines (writer/blobs/quarantine.py) is moved away while a
descriptor of it may sit here: the quarantine notifies channel `arkvory_blobs` with the digest,
and every process's control connection (shared/cluster/control.py) makes `forget_everywhere`
drop it, so no process keeps serving a corrupt file from a cached descriptor. The registry of
live instances is process-wide because the notification is: the control connection exists before
the storage it would otherwise need a handle on.

A cached descriptor may be the last reference to a file that was unlinked meanwhile (cleanup
deleted the blob, an upload replaced it); closing it frees the file's blocks, which can take
seconds for a large blob. The storage's cache therefore closes in a worker thread
(`close_in_background`), never on the event loop that serves downloads and writes read pins.
"""

from __future__ import annotations

import collections
import concurrent.futures
import math
import os
import time
import weakref
from collections.abc import Callable

IDLE_S = 10.0
CHANNEL = "arkvory_blobs"  # payload: a digest whose file moved away, or "*" for every blob
EVERY_BLOB = "*"

_live: weakref.WeakSet[OpenBlobs] = weakref.WeakSet()
_closer: concurrent.futures.ThreadPoolExecutor | None = None


def close_in_background(fd: int) -> None:
    """Close `fd` in a worker thread, not waited for. Its number stays taken until then, so
    nothing can reuse it meanwhile."""
    global _closer
    if _closer is None:
        _closer = concurrent.futures.ThreadPoolExecutor(1, "arkvory-close")
    _closer.submit(os.close, fd)


def forget_everywhere(sha256: str = EVERY_BLOB) -> None:
    """Drop the cached descriptor of `sha256` (every one for "*") in every cache of this process:
    the next download opens the path again and finds what is there now."""
    for blobs in list(_live):
        if sha256 == EVERY_BLOB:
            blobs.forget_all()
        else:
            blobs.forget(sha256)


class OpenBlobs:
    def __init__(
        self,
        path_of: Callable[[str], str],
        capacity: int = 128,
        idle_s: float = IDLE_S,
        clock: Callable[[], float] = time.monotonic,
        close: Callable[[int], None] = os.close,
    ) -> None:
        self._path_of = path_of
        self._close = close
        self.capacity = capacity
        self.idle_s = idle_s
        self._clock = clock
        # sha256 -> [fd, users, last used], least recently used first
        self._open: collections.OrderedDict[str, list] = collections.OrderedDict()
        self._evicted: dict[int, list] = {}  # pushed out while in use, by fd
        self._next_sweep = -math.inf  # when idle descriptors are looked for next
        _live.add(self)

    def acquire(self, sha256: str) -> int:
        """An open descriptor of the blob (FileNotFoundError when it is missing); give it back
        with `release`."""
        now = self._clock()
        if now >= self._next_sweep:
            self._next_sweep = now + self.idle_s / 10
            self._close_idle(now)
        entry = self._open.get(sha256)
        if entry is None:
            entry = self._open[sha256] = [os.open(self._path_of(sha256), os.O_RDONLY), 0, now]
            self._evict()
        else:
            self._open.move_to_end(sha256)
        entry[1] += 1
        entry[2] = now
        return entry[0]

    def release(self, sha256: str, fd: int) -> None:
        entry = self._open.get(sha256)
        if entry is None or entry[0] != fd:
            entry = self._evicted[fd]
            entry[1] -= 1
            if entry[1] == 0:
                del self._evicted[fd]
                self._close(fd)
            return
        entry[1] -= 1
        entry[2] = self._clock()

    def forget(self, sha256: str) -> None:
        """Close the cached descriptor now (a transfer still using it keeps it until it ends)."""
        entry = self._open.pop(sha256, None)
        if entry is not None:
            self._drop(entry)

    def forget_all(self) -> None:
        for entry in self._open.values():
            self._drop(entry)
        self._open.clear()

    def close(self) -> None:
        self.forget_all()

    def __len__(self) -> int:
        return len(self._open)

    def _close_idle(self, now: float) -> None:
        # The least recently used come first: stop at the first one still fresh. One in use is
        # not idle: it goes to the back (each entry is looked at once per call at most).
        for _ in range(len(self._open)):
            sha256, entry = next(iter(self._open.items()))
            if now - entry[2] < self.idle_s:
                return
            if entry[1]:
                self._open.move_to_end(sha256)
                continue
            del self._open[sha256]
            self._close(entry[0])

    def _evict(self) -> None:
        while len(self._open) > self.capacity:
            _, entry = self._open.popitem(last=False)
            self._drop(entry)

    def _drop(self, entry: list) -> None:
        if entry[1] == 0:
            self._close(entry[0])
        else:
            self._evicted[entry[0]] = entry
