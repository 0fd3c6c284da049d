"""A process-local cache that the database keeps honest: it is trusted only while this process
LISTENs on the cache's channel, and emptied on every notification and every (re)connection.

The lifecycle is the same for every such cache (catalog lookups, credentials): `listen` on the
control connection, `stop_listening` when it is lost (nothing is answered or stored until
`listen` again), and a generation number so that an answer read before a change notified is
never stored after it.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import asyncpg


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

    async def listen(self, conn: asyncpg.Connection) -> None:
        """LISTEN on `conn`, then forget what a missed notification could have made stale."""
        await conn.add_listener(self.channel, self._on_change)
        # Lookups that began before this point may have read while nobody listened: the
        # generation bump makes `_store` refuse their answers.
        self.invalidate()
        self._listening = True

    def stop_listening(self) -> None:
        """The control connection is gone (or closing): answer nothing from memory until `listen`."""
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

    def _on_change(self, conn: object, pid: int, channel: str, payload: str) -> None:
        self.invalidate()
