"""Whether this process's storage answers: the verdict of a supervised probe loop, read by the
readiness document, `/health/status` (a process whose store is down is `degraded`: it stays in
the balancer's pool and serves its read cache) and the content path (a read the cache cannot
serve answers 503 at once instead of waiting on a dead store).

A read that fails on the store does not decide alone (one reset connection is no outage): it
asks for a probe at once (`suspect`), and the probe's answer decides. While the store is down the
probe runs every DOWN_EVERY_S, so serving resumes by itself within about that long after the
store answers again; no restart is needed. Each outage is logged once when it starts and once
when it ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import anyio

from .interface import BlobStorage, StorageError

log = logging.getLogger("arkvory.storage")

UP_EVERY_S = 5.0
DOWN_EVERY_S = 1.0
CHECK_TIMEOUT_S = 3.0


class StorageHealth:
    def __init__(self, storage: BlobStorage | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.storage = storage
        self.available = True
        self.reason: str | None = None  # why it is unavailable, one line (never a secret)
        self.checked_at: float | None = None
        self._clock = clock
        self._wake: asyncio.Event | None = None

    def suspect(self, reason: str) -> None:
        """A request met a failure of the store: probe now."""
        if self.available:
            log.info("the storage failed a request (%s): checking it now", reason)
        if self._wake is not None:
            self._wake.set()

    async def probe(self) -> bool:
        """Check the storage once; the verdict is recorded and returned."""
        assert self.storage is not None
        try:
            with anyio.fail_after(CHECK_TIMEOUT_S):
                await self.storage.check()
        except TimeoutError:
            self._down(f"{self.storage.location} did not answer within {CHECK_TIMEOUT_S:.0f} s")
        except StorageError as exc:
            self._down(exc.message)
        else:
            if not self.available:
                log.warning("the storage %s answers again: serving its blobs", self.storage.location)
            self.available, self.reason = True, None
        self.checked_at = self._clock()
        return self.available

    def _down(self, reason: str) -> None:
        if self.available:
            log.error("the storage is unavailable: %s; degraded: reads of blobs not in the read cache and "
                      "uploads answer 503 until it answers again", reason)
        self.available, self.reason = False, reason

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """The probe loop (supervised by the runtime): runs until cancelled."""
        self._wake = asyncio.Event()
        task_status.started()
        while True:
            await self.probe()
            every = UP_EVERY_S if self.available else DOWN_EVERY_S
            try:
                async with asyncio.timeout(every):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
