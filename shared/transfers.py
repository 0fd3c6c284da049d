"""The transfers in flight in this process, so that a lost lease can cut every one of them at
once (SPEC §4): not only those waiting for tokens, but also those waiting for a slow socket.

(Skeleton: the streaming code registers its transfers here; the runtime calls `abort_all`.)
"""

from __future__ import annotations


class Transfers:
    def __init__(self) -> None:
        self._aborters: set = set()

    def abort_all(self, reason: str) -> int:
        """Cut every registered transfer now; returns how many were cut."""
        aborters, self._aborters = self._aborters, set()
        for abort in aborters:
            abort(reason)
        return len(aborters)
