"""Blob files kept open between downloads of the same content.

Opening a blob resolves four directories, a noticeable share of a small download. Blobs are
content-addressed and immutable, so a descriptor kept open serves the right bytes for as long as
it is open, even if the file is unlinked meanwhile (a transfer starts only after the catalog
lookup found its artifact, and holds a read pin while it streams). At most `capacity` blobs
are kept; one still in use when it is pushed out is closed by its last user.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable


class OpenBlobs:
    def __init__(self, path_of: Callable[[str], str], capacity: int = 128) -> None:
        self._path_of = path_of
        self.capacity = capacity
        self._open: collections.OrderedDict[str, list[int]] = collections.OrderedDict()  # [fd, users]
        self._evicted: dict[int, list[int]] = {}  # pushed out while in use, by fd

    def acquire(self, sha256: str) -> int:
        """An open descriptor of the blob (FileNotFoundError when it is missing); give it back
        with `release`."""
        entry = self._open.get(sha256)
        if entry is None:
            entry = self._open[sha256] = [os.open(self._path_of(sha256), os.O_RDONLY), 0]
            self._evict()
        else:
            self._open.move_to_end(sha256)
        entry[1] += 1
        return entry[0]

    def release(self, sha256: str, fd: int) -> None:
        entry = self._open.get(sha256)
        if entry is None or entry[0] != fd:
            entry = self._evicted[fd]
            entry[1] -= 1
            if entry[1] == 0:
                del self._evicted[fd]
                os.close(fd)
            return
        entry[1] -= 1

    def close(self) -> None:
        for fd, users in self._open.values():
            if users == 0:
                os.close(fd)
            else:
                self._evicted[fd] = [fd, users]
        self._open.clear()

    def __len__(self) -> int:
        return len(self._open)

    def _evict(self) -> None:
        while len(self._open) > self.capacity:
            _, entry = self._open.popitem(last=False)
            if entry[1] == 0:
                os.close(entry[0])
            else:
                self._evicted[entry[0]] = entry
