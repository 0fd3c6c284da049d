"""The transfers in flight in this process, so that a lost lease can cut every one of them at
once (SPEC §4): not only those waiting for tokens, but also those waiting for a slow socket.

The streaming code registers each transfer with an aborter (a function that drops its connection
and counts why) for as long as it may send; the runtime calls `abort_all` when trust ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

Aborter = Callable[[str], None]


class Transfers:
    def __init__(self) -> None:
        self._aborters: set[Aborter] = set()

    def __len__(self) -> int:
        return len(self._aborters)

    @contextlib.contextmanager
    def track(self, aborter: Aborter) -> Iterator[None]:
        """Register one transfer for the duration of the block."""
        self._aborters.add(aborter)
        try:
            yield
        finally:
            self._aborters.discard(aborter)

    def add(self, aborter: Aborter) -> None:
        """`track` without a context manager, for the per-download path (pair with `discard`)."""
        self._aborters.add(aborter)

    def discard(self, aborter: Aborter) -> None:
        self._aborters.discard(aborter)

    def abort_all(self, reason: str) -> int:
        """Cut every registered transfer now; returns how many were cut."""
        aborters, self._aborters = self._aborters, set()
        for abort in aborters:
            abort(reason)
        return len(aborters)
