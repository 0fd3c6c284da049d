"""Content lookups remembered until the catalog changes.

A trigger (migration 0003) notifies channel `arkvory_catalog` when a repository, artifact,
package or asset is updated or deleted; every process listens on its control connection and
forgets everything at once. Only positive answers are kept (a new artifact cannot make one
stale), permissions are still checked on every request against the remembered repository, and
while the listener is not connected nothing is remembered *or answered*: a change made during
the gap would go unnoticed. The control connection (shared/cluster/control.py) re-listens after
a loss, and only then is the cache flushed and trusted again.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from arkvory.shared.cluster.notified_cache import NotifiedCache

CHANNEL = "arkvory_catalog"
MAX_ENTRIES = 10_000


class CatalogCache(NotifiedCache):
    channel = CHANNEL
    max_entries = MAX_ENTRIES

    def get(self, key: Hashable) -> Any | None:
        value = self._lookup(key)
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
        return value

    def put(self, key: Hashable, value: Any, generation: int) -> None:
        self._store(key, value, generation)
