"""Content lookups remembered until the catalog changes.

A trigger (migration 0003) notifies channel `arkvory_catalog` when a repository, artifact,
package or asset is updated or deleted; every process listens on its control connection and
forgets everything at once. Only positive answers are kept (a new artifact cannot make one
stale), permissions are still checked on every request against the remembered repository, and
while the listener is not connected nothing is remembered *or answered*: a change made during
the gap would go unnoticed. The control connection (control.py) re-listens after a loss, and
only then is the cache flushed and trusted again.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from typing import Any

import asyncpg

log = logging.getLogger("arkvory.catalog")

CHANNEL = "arkvory_catalog"
MAX_ENTRIES = 10_000


class CatalogCache:
    def __init__(self) -> None:
        self._entries: dict[Hashable, Any] = {}
        self._generation = 0
        self._listening = False
        self.hits = 0
        self.misses = 0

    @property
    def listening(self) -> bool:
        return self._listening

    async def listen(self, conn: asyncpg.Connection) -> None:
        """LISTEN on `conn`, then forget what a missed notification could have made stale."""
        await conn.add_listener(CHANNEL, self._on_change)
        # Lookups that began before this point may have read the catalog while nobody listened:
        # the generation bump makes `put` refuse their answers.
        self.invalidate()
        self._listening = True

    def stop_listening(self) -> None:
        """The control connection is gone (or closing): answer nothing from memory until `listen`."""
        self._listening = False
        self.invalidate()

    @property
    def generation(self) -> int:
        """Read before a lookup; `put` refuses an answer that a change overtook meanwhile."""
        return self._generation

    def get(self, key: Hashable) -> Any | None:
        value = self._entries.get(key) if self._listening else None
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
        return value

    def put(self, key: Hashable, value: Any, generation: int) -> None:
        if not self._listening or generation != self._generation:
            return
        if len(self._entries) >= MAX_ENTRIES:
            self._entries.clear()
        self._entries[key] = value

    def invalidate(self) -> None:
        self._generation += 1
        self._entries.clear()

    def _on_change(self, conn: object, pid: int, channel: str, table: str) -> None:
        self.invalidate()
