"""Read pins: while a transfer streams a blob, `arkvory_read_pins` holds a row for it, so the
cleanup task never deletes a blob that is being read (SPEC §3).

Pins are counted in memory and written in batches on a dedicated connection: within 100 ms
when a new digest appears (new digests of that window share one write), and every 2 s to
refresh. Each row expires on its own 10 s after its last refresh, so a pin outlives neither its
transfer nor its process's lease by more than the lease time, even when the process dies.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Iterator

import asyncpg

log = logging.getLogger("arkvory.pins")

REFRESH_S = 2.0
BATCH_S = 0.1  # new digests within this window share one write
PIN_SECONDS = 10.0
FLUSH_TIMEOUT_S = 2.0

_UPSERT = """
INSERT INTO arkvory_read_pins (slot, sha256, pinned_until)
SELECT $1, digest, now() + make_interval(secs => $3) FROM unnest($2::text[]) AS digest
ON CONFLICT (slot, sha256) DO UPDATE SET pinned_until = excluded.pinned_until
"""
_DROP_OTHERS = "DELETE FROM arkvory_read_pins WHERE slot = $1 AND NOT (sha256 = ANY($2::text[]))"


class ReadPins:
    def __init__(self, slot: int) -> None:
        self.slot = slot
        self._counts: collections.Counter[str] = collections.Counter()
        self._changed = asyncio.Event()
        self._conn: asyncpg.Connection | None = None

    @contextlib.contextmanager
    def hold(self, sha256: str) -> Iterator[None]:
        """Pin `sha256` for the duration of the block (one transfer)."""
        self._counts[sha256] += 1
        if self._counts[sha256] == 1:
            self._changed.set()
        try:
            yield
        finally:
            self._counts[sha256] -= 1
            if self._counts[sha256] <= 0:
                del self._counts[sha256]

    @property
    def digests(self) -> list[str]:
        return list(self._counts)

    async def run(self, database_url: str) -> None:
        """Flush pins until cancelled; failures are logged and retried on the next round."""
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), REFRESH_S)
                    await asyncio.sleep(BATCH_S)  # a burst of small downloads: one write
                self._changed.clear()
                await self.flush(database_url)
        finally:
            if self._conn is not None:
                self._conn.terminate()
                self._conn = None

    async def flush(self, database_url: str) -> None:
        digests = self.digests
        try:
            if self._conn is None or self._conn.is_closed():
                self._conn = await asyncpg.connect(
                    database_url,
                    timeout=FLUSH_TIMEOUT_S,
                    server_settings={"application_name": f"arkvory-pins-slot-{self.slot}"},
                )
            async with asyncio.timeout(FLUSH_TIMEOUT_S):
                async with self._conn.transaction():
                    if digests:
                        await self._conn.execute(_UPSERT, self.slot, digests, PIN_SECONDS)
                    await self._conn.execute(_DROP_OTHERS, self.slot, digests)
        except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
            log.warning("could not write read pins: %s: %s", exc.__class__.__name__, exc)
            if self._conn is not None:
                self._conn.terminate()
                self._conn = None
