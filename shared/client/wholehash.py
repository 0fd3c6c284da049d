"""The SHA-256 of a whole file, computed from the parts an upload sends while it sends them.

Parts are read once, by the threads that send them; this thread hashes them in index order as
they are offered, and reads from the file itself the parts it will not be offered (those the
server already has). So the file is read once and the whole-file hash costs no time of its own
next to the network. Senders take parts in increasing order, so only a few wait here at once;
`MAX_WAITING` bounds that anyway.
"""

from __future__ import annotations

import hashlib
import os
import threading

from .errors import LocalIOError

MAX_WAITING = 8  # parts offered ahead of the one being hashed; a sender waits beyond that


class WholeFileHash:
    """Hashes parts 0..count-1 of the file open as `fd`; `offer()` the ones in `offered`."""

    def __init__(self, fd: int, size: int, part_size: int, offered: set[int], path: str) -> None:
        self.fd, self.size, self.part_size, self.path = fd, size, part_size, path
        self.offered = offered
        self.count = -(-size // part_size)
        self._waiting: dict[int, bytes] = {}
        self._next = 0
        self._abandoned = False
        self._error: BaseException | None = None
        self._digest = hashlib.sha256()
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="arkvory-whole-hash", daemon=True)
        self._thread.start()

    def offer(self, index: int, data: bytes) -> None:
        with self._changed:
            while len(self._waiting) >= MAX_WAITING and index > self._next and not self._abandoned:
                self._changed.wait(1.0)
            self._waiting[index] = data
            self._changed.notify_all()

    def abandon(self) -> None:
        """The upload failed: stop waiting for parts that will not come."""
        with self._changed:
            self._abandoned = True
            self._changed.notify_all()
        self._thread.join()

    def hexdigest(self) -> str:
        self._thread.join()
        if self._error is not None:
            raise self._error
        if self._abandoned or self._next != self.count:
            raise LocalIOError(f"{self.path}: the whole-file hash was not finished")
        return self._digest.hexdigest()

    def _run(self) -> None:
        try:
            for index in range(self.count):
                data = self._wait_for(index) if index in self.offered else self._read(index)
                if data is None:
                    return
                self._digest.update(data)
                with self._changed:
                    self._next = index + 1
                    self._changed.notify_all()
        except BaseException as exc:  # reported by hexdigest()
            self._error = exc

    def _wait_for(self, index: int) -> bytes | None:
        with self._changed:
            while index not in self._waiting and not self._abandoned:
                self._changed.wait()
            return self._waiting.pop(index, None) if not self._abandoned else None

    def _read(self, index: int) -> bytes:
        offset = index * self.part_size
        length = min(self.size, offset + self.part_size) - offset
        try:
            data = os.pread(self.fd, length, offset)
        except OSError as exc:
            raise LocalIOError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        if len(data) != length:
            raise LocalIOError(f"{self.path} became shorter during the upload")
        return data
