"""The slot lease (SPEC §4): one row per slot in `arkvory_gateway_leases`, fenced by holder id
and generation, reserved for 10 s by the database clock, renewed every 2 s, trusted locally for
at most 8 s after the last successful renewal was *sent*.

Safety argument: the database never lets a holder renew a reservation that has expired
(`expires_at > now()` in the UPDATE), a new holder takes the slot only after `expires_at`, and we
stop trusting our lease 2 s before the reservation we asked for could have run out (8 s < 10 s,
counting from the moment we sent the request, so any delay of the answer only shortens trust).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable

import asyncpg

from .errors import DatabaseUnavailable, SlotBusy

log = logging.getLogger("arkvory.lease")

RESERVATION_S = 10.0
RENEW_EVERY_S = 2.0
TRUST_S = 8.0
ACQUIRE_LIMIT_S = 15.0
# A renewal that has not answered by then is treated as failed: it cannot stretch trust anyway.
RENEW_TIMEOUT_S = 1.5
POLL_S = 0.25

_ACQUIRE = """
INSERT INTO arkvory_gateway_leases AS lease
    (slot, holder_id, generation, pid, host, role, acquired_at, renewed_at, expires_at)
VALUES ($1, $2, 1, $3, $4, $5, now(), now(), now() + make_interval(secs => $6))
ON CONFLICT (slot) DO UPDATE
    SET holder_id = excluded.holder_id, generation = lease.generation + 1,
        pid = excluded.pid, host = excluded.host, role = excluded.role,
        acquired_at = now(), renewed_at = now(), expires_at = excluded.expires_at
    WHERE lease.expires_at <= now()
RETURNING generation
"""
_OBSERVE = """
SELECT holder_id, generation, pid, host, renewed_at,
       extract(epoch FROM expires_at - now()) AS remaining
FROM arkvory_gateway_leases WHERE slot = $1
"""
_RENEW = """
UPDATE arkvory_gateway_leases
SET renewed_at = now(), expires_at = now() + make_interval(secs => $4)
WHERE slot = $1 AND holder_id = $2 AND generation = $3 AND expires_at > now()
"""


class RenewalCounter:
    """Where the lease reports renewals; the metrics module provides the real one."""

    def renewal(self, result: str) -> None: ...

    def lost(self) -> None: ...


class SlotLease:
    def __init__(
        self,
        database_url: str,
        slot: int,
        role: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        report: RenewalCounter | None = None,
    ) -> None:
        self.database_url = database_url
        self.slot = slot
        self.role = role
        self.clock = clock
        self.report = report or RenewalCounter()
        self.holder_id = uuid.uuid4()
        self.generation: int | None = None
        self.lost = asyncio.Event()
        self.lost_reason: str | None = None
        self._trusted_until = 0.0
        self._conn: asyncpg.Connection | None = None
        self._renewing = True

    # -- trust, read on every request and every grant -------------------------------------

    def trust_remaining(self) -> float:
        if self.lost.is_set():
            return 0.0
        return max(0.0, self._trusted_until - self.clock())

    @property
    def trusted(self) -> bool:
        return not self.lost.is_set() and self.clock() < self._trusted_until

    # -- acquisition ----------------------------------------------------------------------

    async def acquire(self) -> None:
        """Take the slot, waiting for an old reservation to run out (≤ 15 s in total).

        A holder that is still renewing makes us stop with `busy` (SlotBusy, exit 3).
        """
        started = self.clock()
        deadline = started + ACQUIRE_LIMIT_S
        seen: tuple | None = None
        while True:
            conn = await self._connection()
            sent = self.clock()
            generation = await conn.fetchval(
                _ACQUIRE,
                self.slot,
                self.holder_id,
                os.getpid(),
                socket.gethostname(),
                self.role,
                RESERVATION_S,
                timeout=RENEW_TIMEOUT_S * 2,
            )
            if generation is not None:
                self.generation = generation
                self._trusted_until = sent + TRUST_S
                log.info(
                    "slot %d acquired (generation %d) after %.1f s",
                    self.slot,
                    generation,
                    self.clock() - started,
                )
                return
            holder = await conn.fetchrow(_OBSERVE, self.slot, timeout=RENEW_TIMEOUT_S * 2)
            if holder is None:
                continue  # the row vanished (policy reset): try again at once
            fingerprint = (holder["holder_id"], holder["generation"], holder["renewed_at"])
            if seen is not None and seen[:2] == fingerprint[:2] and seen[2] != fingerprint[2]:
                raise SlotBusy(self._busy_message(holder, "it is still renewing"))
            if seen is not None and seen[:2] != fingerprint[:2]:
                raise SlotBusy(self._busy_message(holder, "another process took it meanwhile"))
            seen = fingerprint
            remaining = float(holder["remaining"])
            if self.clock() + remaining > deadline:
                raise SlotBusy(self._busy_message(holder, f"its reservation runs {remaining:.1f} s more"))
            log.info(
                "slot %d is reserved by pid %s on %s for %.1f s more; waiting",
                self.slot,
                holder["pid"],
                holder["host"],
                remaining,
            )
            await asyncio.sleep(min(max(remaining, 0.0) + 0.05, POLL_S * 4))

    def _busy_message(self, holder: asyncpg.Record, why: str) -> str:
        return (
            f"slot {self.slot} is busy: held by pid {holder['pid']} on {holder['host']} "
            f"(generation {holder['generation']}), {why}; "
            "stop that process or choose another ARKVORY_GATEWAY_SLOT"
        )

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            try:
                self._conn = await asyncpg.connect(
                    self.database_url,
                    timeout=RENEW_TIMEOUT_S * 2,
                    # The server gives up on a renewal we no longer wait for.
                    server_settings={
                        "statement_timeout": str(int(RENEW_TIMEOUT_S * 1000)),
                        "application_name": f"arkvory-lease-slot-{self.slot}",
                    },
                )
            except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
                raise DatabaseUnavailable(f"cannot open the lease connection: {exc}") from exc
        return self._conn

    # -- renewal --------------------------------------------------------------------------

    async def run(self) -> None:
        """Renew every 2 s until stopped or lost; returns when the lease is lost or stopped."""
        next_send = self.clock() + RENEW_EVERY_S
        while self._renewing and not self.lost.is_set():
            await asyncio.sleep(max(0.0, min(next_send, self._trusted_until) - self.clock()))
            if not self._renewing:
                return
            if not self.trusted:
                self._lose("trust ran out before a renewal succeeded")
                return
            next_send = self.clock() + RENEW_EVERY_S
            await self.renew_once()

    async def renew_once(self) -> None:
        sent = self.clock()
        try:
            conn = await asyncio.wait_for(self._connection(), self._time_left(sent))
            status = await asyncio.wait_for(
                conn.execute(
                    _RENEW, self.slot, self.holder_id, self.generation, RESERVATION_S
                ),
                self._time_left(sent),
            )
        except (OSError, TimeoutError, asyncpg.PostgresError, DatabaseUnavailable) as exc:
            self.report.renewal("failed")
            log.warning("slot %d renewal failed: %s: %s", self.slot, exc.__class__.__name__, exc)
            self._drop_connection()
            return
        if status != "UPDATE 1":
            self.report.renewal("rejected")
            self._lose("the database refused the renewal (reservation expired or taken over)")
            return
        if self.clock() >= self._trusted_until:
            # A late answer never revives a lease whose local trust already ran out.
            self.report.renewal("late")
            self._lose("the renewal answered after local trust ran out")
            return
        self.report.renewal("ok")
        self._trusted_until = sent + TRUST_S

    def _time_left(self, sent: float) -> float:
        return max(0.01, min(RENEW_TIMEOUT_S - (self.clock() - sent), self._trusted_until - self.clock()))

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.terminate()  # never wait on a connection that just hung
            self._conn = None

    def _lose(self, reason: str) -> None:
        if self.lost.is_set():
            return
        self.lost_reason = reason
        self.lost.set()
        self.report.lost()
        log.error("slot %d lease LOST: %s", self.slot, reason)
        self._drop_connection()

    def stop_renewing(self) -> None:
        """Graceful stop: keep the reservation (bytes may still be in flight), just stop renewing."""
        self._renewing = False

    async def close(self) -> None:
        self._renewing = False
        if self._conn is not None:
            try:
                await asyncio.wait_for(self._conn.close(), 2.0)
            except (OSError, TimeoutError, asyncpg.PostgresError):
                self._conn.terminate()
            self._conn = None
