"""Read pins: while a transfer streams a blob, `arkvory_read_pins` holds a row for it, so the
cleanup task never deletes a blob that is being read (SPEC §3).

Pins are counted in memory and written in batches on a dedicated connection: within 100 ms
when a new digest appears (new digests of that window share one write), at once when a
transfer waits for its pin (`until_visible`; concurrent waiters share the next write), and
every 2 s to refresh. Each row expires on its own 10 s after its last refresh, so a pin
outlives neither its transfer nor its process's lease by more than the lease time, even when
the process dies. A digest stays pinned for LINGER_S after its last transfer ends, so a blob
read again and again keeps a visible pin and its downloads never wait for a write.

Pin before open: a transfer holds its pin from the moment its artifact was looked up, and
opens the blob only once a committed write includes the digest (`until_visible`). Cleanup
re-checks pins under the digest's lock (writer/maintenance/cleanup.py) in a statement that
starts after it holds the lock, so it either sees our pin and keeps the blob, or it checked
before our pin was committed, that is before our open: then its unlink either comes before
our open (which fails with ENOENT, and the content path looks the artifact up again: gone →
404) or after it (our descriptor keeps the bytes; Linux frees them at the last close). And a
cleanup that checked before our pin can only delete a blob no artifact referenced at its
check, because uploads claim the digest under the same lock.

The converse needs the same care as the lease: a row we could not refresh expires while the
blob is still being read. So pins are trusted like the lease, for 8 s after the last successful
write was *sent* (2 s before its rows can expire); past that `healthy` is false, the process
hands out no payload (`Runtime.payload_allowed`) until a write succeeds again, and `run` calls
`on_unhealthy` once per outage so that transfers in flight are cut. A failed write is reported
to `supervision.DATABASE` (one line per outage), not logged per attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import anyio
import asyncpg

from arkvory.shared import db

from .lease import TRUST_S
from .supervision import DATABASE

log = logging.getLogger("arkvory.pins")

REFRESH_S = 2.0
BATCH_S = 0.1  # new digests within this window share one write
PIN_SECONDS = 10.0
FLUSH_TIMEOUT_S = 2.0
LINGER_S = 10.0  # a digest stays pinned this long after its last transfer ended
VISIBLE_WAIT_S = 4.0  # a transfer waits at most this long for its pin to be written
LOOP = "read pins"  # as named in the process's database outage lines

_UPSERT = """
INSERT INTO arkvory_read_pins (slot, sha256, pinned_until)
SELECT $1, digest, now() + make_interval(secs => $3) FROM unnest($2::text[]) AS digest
ON CONFLICT (slot, sha256) DO UPDATE SET pinned_until = excluded.pinned_until
"""
_DROP_OTHERS = "DELETE FROM arkvory_read_pins WHERE slot = $1 AND NOT (sha256 = ANY($2::text[]))"


class ReadPins:
    def __init__(self, slot: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.slot = slot
        self.clock = clock
        # Transfers holding each digest: a plain dict (Counter's __missing__ and __delitem__ are
        # Python calls, two per download).
        self._counts: dict[str, int] = {}
        # Digests whose last transfer ended, with when: still written for LINGER_S.
        self._released: dict[str, float] = {}
        self._changed = asyncio.Event()
        self._urgent = asyncio.Event()  # a transfer waits for its pin: write now
        # The digests of the last committed write, and the event of the next write's end.
        self._visible: frozenset[str] = frozenset()
        self._round = asyncio.Event()
        self._conn: asyncpg.Connection | None = None
        # None until `run` starts: before that no transfer exists (the port is not bound yet).
        self._written_until: float | None = None

    def hold(self, sha256: str) -> _Hold:
        """Pin `sha256` for the duration of a `with` block (one transfer)."""
        return _Hold(self, sha256)

    def take(self, sha256: str) -> None:
        """Pin `sha256` until the matching `give_back`: `hold` as two plain calls, for the
        per-download path (a small download then builds no context manager)."""
        counts = self._counts
        held = counts[sha256] = counts.get(sha256, 0) + 1
        if held == 1 and sha256 not in self._released:
            self._changed.set()

    def give_back(self, sha256: str) -> None:
        counts = self._counts
        left = counts[sha256] - 1
        if left <= 0:
            del counts[sha256]
            self._released[sha256] = self.clock()
        else:
            counts[sha256] = left

    @property
    def digests(self) -> list[str]:
        """What the next write pins: held digests and those released within LINGER_S."""
        now = self.clock()
        for sha256 in [d for d, at in self._released.items() if now - at >= LINGER_S]:
            del self._released[sha256]
        return list(self._counts.keys() | self._released.keys())

    def is_visible(self, sha256: str) -> bool:
        """A committed pin row of ours for `sha256` exists and cannot have expired. (A row of
        the last write stays until the next write commits, and the next write keeps every
        digest held or released within LINGER_S.)"""
        return sha256 in self._visible and self.healthy

    async def until_visible(self, sha256: str, timeout: float = VISIBLE_WAIT_S) -> None:
        """Return once a committed write includes `sha256`, which the caller holds (`hold`);
        TimeoutError when none did in time (the database is slow or gone)."""
        async with asyncio.timeout(timeout):
            while not self.is_visible(sha256):
                if sha256 not in self._counts:
                    raise RuntimeError("until_visible needs a hold on the digest")
                next_write = self._round
                self._urgent.set()
                self._changed.set()
                await next_write.wait()

    @property
    def healthy(self) -> bool:
        """Pins were written recently enough that no row of ours can have expired."""
        return self._written_until is None or self.clock() < self._written_until

    def write_age(self) -> float:
        """Seconds since the last committed write was sent (0 before `run`): about REFRESH_S at
        most while the database answers; past TRUST_S no payload is served."""
        if self._written_until is None:
            return 0.0
        return max(0.0, self.clock() - (self._written_until - TRUST_S))

    async def run(
        self,
        database_url: str,
        on_unhealthy: Callable[[], None] = lambda: None,
        *,
        task_status=anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Flush pins until cancelled; failures are logged and retried on the next round."""
        self._written_until = self.clock() + TRUST_S
        task_status.started()
        reported = False
        try:
            while True:
                # Wake up when the window runs out too, so that the cut is not late.
                left = self._written_until - self.clock()
                wait = min(REFRESH_S, left) if left > 0 else REFRESH_S
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), wait)
                    if not self._urgent.is_set():
                        # A burst of new digests: one write, unless a transfer waits for it.
                        await asyncio.wait_for(self._urgent.wait(), BATCH_S)
                self._changed.clear()
                self._urgent.clear()
                written = await self.flush(database_url)
                ended, self._round = self._round, asyncio.Event()
                ended.set()
                if not written:
                    await asyncio.sleep(BATCH_S)  # waiters must not make a failing write spin
                if not self.healthy and not reported:
                    reported = True
                    log.error(
                        "read pins could not be written for %.0f s: no payload is served until they are",
                        TRUST_S,
                    )
                    on_unhealthy()
                elif self.healthy and reported:
                    reported = False
                    log.info("read pins are written again: serving payload again")
        finally:
            if self._conn is not None:
                self._conn.terminate()
                self._conn = None

    async def flush(self, database_url: str) -> bool:
        """Write the pins; True when the write committed."""
        digests = self.digests
        sent = self.clock()
        # A write still hanging when the window ends must not delay the cut.
        left = FLUSH_TIMEOUT_S
        if self._written_until is not None and self._written_until > sent:
            left = min(FLUSH_TIMEOUT_S, self._written_until - sent)
        try:
            if self._conn is None or self._conn.is_closed():
                self._conn = await db.open_connection(
                    database_url,
                    timeout=FLUSH_TIMEOUT_S,
                    # Both ends give up on a write that hangs (a locked table, a hung server).
                    command_timeout=FLUSH_TIMEOUT_S,
                    server_settings={
                        "application_name": f"arkvory-pins-slot-{self.slot}",
                        "statement_timeout": str(int(FLUSH_TIMEOUT_S * 1000)),
                    },
                )
            async with asyncio.timeout(max(0.05, left)):
                async with self._conn.transaction():
                    if digests:
                        await self._conn.execute(_UPSERT, self.slot, digests, PIN_SECONDS)
                    await self._conn.execute(_DROP_OTHERS, self.slot, digests)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            DATABASE.failed(LOOP, exc)
            if self._conn is not None:
                self._conn.terminate()
                self._conn = None
            return False
        DATABASE.succeeded(LOOP)
        self._written_until = sent + TRUST_S
        self._visible = frozenset(digests)
        return True


class _Hold:
    __slots__ = ("pins", "sha256")

    def __init__(self, pins: ReadPins, sha256: str) -> None:
        self.pins = pins
        self.sha256 = sha256

    def __enter__(self) -> None:
        self.pins.take(self.sha256)

    def __exit__(self, *exc_info: object) -> None:
        self.pins.give_back(self.sha256)
