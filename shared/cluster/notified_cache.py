"""A process-local cache that the database keeps honest: it is trusted only while this process
LISTENs on the cache's channel, and emptied on every notification and every (re)connection.

The lifecycle is the same for every such cache (catalog lookups, credentials), subscribed to the
control connection's channel by the composition root (shared/process/runtime.py):
`started_listening` once the LISTEN holds, `notified` on every notification, `stop_listening`
when the connection is lost (nothing is answered or stored until `started_listening` again), and
a generation number so that an answer read before a change notified is never stored after it.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any


class NotifiedCache:
    channel: str = ""
    max_entries = 10_000

    def __init__(self) -> None:
        self._entries: dict[Hashable, Any] = {}
        self._generation = 0
        self._listening = False
        self.hits = 0
        self.misses = 0

    @property
    def listening(self) -> bool:
        return self._listening

    @property
    def generation(self) -> int:
        """Read before a lookup; `_store` refuses an answer that a change overtook meanwhile."""
        return self._generation

    def started_listening(self) -> None:
        """The LISTEN on `channel` holds: forget what a missed notification could have made
        stale, then trust what is stored from now on."""
        # Lookups that began before this point may have read while nobody listened: the
        # generation bump makes `_store` refuse their answers.
        self.invalidate()
        self._listening = True

    def stop_listening(self) -> None:
        """The control connection is gone (or closing): answer nothing from memory until
        `started_listening`."""
        self._listening = False
        self.invalidate()

    def invalidate(self) -> None:
        self._generation += 1
        self._entries.clear()

    def _lookup(self, key: Hashable) -> Any | None:
        return self._entries.get(key) if self._listening else None

    def _store(self, key: Hashable, value: Any, generation: int) -> None:
        if not self._listening or generation != self._generation:
            return
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        self._entries[key] = value

    def notified(self, payload: str) -> None:
        """A change was notified on `channel`: forget everything."""
        self.invalidate()
