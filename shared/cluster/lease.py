"""The slot lease (SPEC §4): one row per slot in `arkvory_gateway_leases`, fenced by holder id
and generation, reserved for 10 s by the database clock, renewed every 2 s, trusted locally for
at most 8 s after the last successful renewal was *sent*.

Safety argument: the database never lets a holder renew a reservation that has expired
(`expires_at > now()` in the UPDATE), a new holder takes the slot only after `expires_at`, and we
stop trusting our lease 2 s before the reservation we asked for could have run out (8 s < 10 s,
counting from the moment we sent the request, so any delay of the answer only shortens trust).
An answer that arrives after trust ran out never revives it: the lease is lost for good.

Where it runs: acquisition and every renewal happen in a thread of their own, with their own
event loop and their own connection (asyncpg works in any loop), started at acquisition, so the
first renewal is due 2 s after the acquisition was sent, and a request that stalls the serving
loop cannot delay a renewal. Trust itself is only a deadline on the monotonic clock: `trusted`,
`trust_remaining()`, `generation` and `lost_reason` are plain attribute reads, cheap and safe
from the serving loop, and stay correct even when neither loop runs (a stalled process reads
"not trusted" the moment it wakes up past the deadline). The thread tells the serving loop about
a loss through `call_soon_threadsafe` (`wait_lost`). What the thread cannot beat is one C call
that holds the GIL for seconds; request input is bounded so none does, and if one did, trust
would still run out on time and no payload would follow it.

The acquisition is conditional on the saved download policy still being the one this process
checked: a `reset-download-policy` racing with the start-up leaves no lease behind (exit 78).
A failed renewal is counted and reported to `supervision.DATABASE` (one line per outage).

A planned stop marks the row released while its reservation is still live (`released_at`); a
reservation that runs out unreleased is a lost lease, counted in the row by whoever takes the
slot next (`unreleased_ends`), so that every surviving process can report it
(lease_history.py), not only this one, which exits two seconds after a loss.

In demand mode (`shares`, shared/cluster/grants.py) the renewal is one statement that also
reports the process's demand and returns its share; the share is in force only once the renewal
is accepted by the rules above, and `renew_soon` lets the serving loop ask for an early renewal.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

import asyncpg

from arkvory.shared import db
from arkvory.shared.errors import DatabaseUnavailable, SlotBusy, StartupRefused

from .grants import ShareExchange
from .supervision import DATABASE, describe_failure

log = logging.getLogger("arkvory.lease")

RESERVATION_S = 10.0
RENEW_EVERY_S = 2.0
TRUST_S = 8.0
ACQUIRE_LIMIT_S = 15.0
# A renewal that has not answered by then is treated as failed: it cannot stretch trust anyway.
RENEW_TIMEOUT_S = 1.5
POLL_S = 0.25
CLOSE_TIMEOUT_S = 3.0
LOOP = "slot lease"  # as named in the process's database outage lines

# $7..$9: the policy this process checked. FOR SHARE keeps a concurrent reset from deleting the
# policy row under us; a reset that committed first leaves no row, so nothing is inserted.
# $10: the URL this process serves on (the console reads each process's readiness there);
# $11: the share mode it checked.
_ACQUIRE = """
INSERT INTO arkvory_gateway_leases AS lease
    (slot, holder_id, generation, pid, host, role, url, acquired_at, renewed_at, expires_at)
SELECT $1, $2, 1, $3, $4, $5, $10, now(), now(), now() + make_interval(secs => $6)
FROM arkvory_download_policy AS policy
WHERE policy.slots = $7 AND policy.total_bytes_per_second = $8
    AND policy.per_principal_bytes_per_second = $9 AND policy.share_mode = $11
FOR SHARE OF policy
ON CONFLICT (slot) DO UPDATE
    SET holder_id = excluded.holder_id, generation = lease.generation + 1,
        pid = excluded.pid, host = excluded.host, role = excluded.role, url = excluded.url,
        acquired_at = now(), renewed_at = now(), expires_at = excluded.expires_at,
        released_at = NULL, unreleased_ends = lease.unreleased_ends + (lease.released_at IS NULL)::int
    WHERE lease.expires_at <= now()
RETURNING generation
"""
_POLICY = """
SELECT slots, total_bytes_per_second, per_principal_bytes_per_second, share_mode FROM arkvory_download_policy
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
# A planned stop marks the reservation released (lease_history.py counts the others as lost),
# but only while it is live: one that ran out unreleased may already be reported lost.
_RELEASE = """
UPDATE arkvory_gateway_leases SET released_at = now()
WHERE slot = $1 AND holder_id = $2 AND generation = $3 AND expires_at > now()
"""


class RenewalCounter:
    """Where the lease reports renewals; the metrics module provides the real one.

    Called from the renewal thread: implementations must be thread-safe (prometheus_client is).
    """

    def renewal(self, result: str) -> None: ...

    def lost(self) -> None: ...


class SlotLease:
    def __init__(
        self,
        database_url: str,
        slot: int,
        role: str,
        policy: tuple[int, int, int],
        *,
        clock: Callable[[], float] = time.monotonic,
        report: RenewalCounter | None = None,
        url: str | None = None,
        share_mode: str = "static",
        shares: ShareExchange | None = None,
    ) -> None:
        """`policy`: (slots, total, per-principal total) as this process checked them, with
        `share_mode`; `url`: where this process serves, recorded in the lease row at acquisition
        (never renewed); `shares`: demand mode's renewal exchange (None in static mode)."""
        self.database_url = database_url
        self.url = url
        self.slot = slot
        self.role = role
        self.policy = policy
        self.share_mode = share_mode
        self.shares = shares
        self.clock = clock
        self.report = report or RenewalCounter()
        self.holder_id = uuid.uuid4()
        self.generation: int | None = None
        self.lost = threading.Event()
        # `lost.is_set()` as a plain attribute: `trusted` is read several times per download.
        self._lost = False
        self.lost_reason: str | None = None
        self._trusted_until = 0.0
        self._renewing = True
        self._lose_once = threading.Lock()
        self._thread: threading.Thread | None = None
        # The renewal thread's loop, connection and wake-up; touched only from that thread
        # (other threads go through `call_soon_threadsafe`).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._conn: asyncpg.Connection | None = None
        # The serving loop, told about a loss.
        self._main_loop: asyncio.AbstractEventLoop | None = None
        self._lost_signal: asyncio.Event | None = None

    # -- trust, read on every request and every grant (any thread) ------------------------

    def trust_remaining(self) -> float:
        if self._lost:
            return 0.0
        return max(0.0, self._trusted_until - self.clock())

    @property
    def trusted(self) -> bool:
        return not self._lost and self.clock() < self._trusted_until

    # -- the serving loop's side ------------------------------------------------------------

    async def start(self) -> None:
        """Take the slot (waiting ≤ 15 s for an old reservation) in the renewal thread, which
        keeps renewing from then on. Raises SlotBusy (exit 3), StartupRefused (exit 78: the
        policy changed) or DatabaseUnavailable (exit 69)."""
        self._main_loop = asyncio.get_running_loop()
        self._lost_signal = asyncio.Event()
        acquired: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._thread_main, args=(acquired,), name=f"arkvory-lease-{self.slot}", daemon=True
        )
        self._thread.start()
        await asyncio.wrap_future(acquired)

    async def wait_lost(self) -> None:
        """Returns once the lease is lost (never, while it is renewed or stopped on purpose)."""
        assert self._lost_signal is not None, "start() first"
        await self._lost_signal.wait()

    def abandon(self, reason: str) -> None:
        """Stop trusting and renewing now (another part of the process failed)."""
        self._lose(reason)

    def renew_soon(self) -> None:
        """Renew now rather than at the next 2 s (demand mode: the demand changed). Any thread."""
        self._wake_thread()

    def stop_renewing(self) -> None:
        """Graceful stop: keep the reservation (bytes may still be in flight), just stop renewing."""
        self._renewing = False
        self._wake_thread()

    async def close(self) -> None:
        """Stop the renewal thread and close its connection (bounded)."""
        self._renewing = False
        self._wake_thread()
        thread = self._thread
        if thread is not None:
            deadline = time.monotonic() + CLOSE_TIMEOUT_S
            while thread.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if thread.is_alive():
                log.warning("slot %d renewal thread did not stop within %.0f s", self.slot, CLOSE_TIMEOUT_S)

    # -- the renewal thread -----------------------------------------------------------------

    def _thread_main(self, acquired: concurrent.futures.Future[None]) -> None:
        if not acquired.set_running_or_notify_cancel():
            return
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._run_in_thread(acquired))
        finally:
            loop.close()

    async def _run_in_thread(self, acquired: concurrent.futures.Future[None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        try:
            try:
                await self._acquire()
            except BaseException as exc:  # the start-up reports it to its caller
                acquired.set_exception(exc)
                return
            acquired.set_result(None)
            await self._renew_until_stopped()
            if not self.lost.is_set():
                await self._release()
        except Exception as exc:
            # Supervision: an unexpected failure of the renewal ends in a lost lease, not in a
            # silent thread that stopped renewing while the serving loop still trusts it.
            log.error("slot %d renewal thread failed", self.slot, exc_info=exc)
            self._lose(f"the renewal failed unexpectedly: {exc.__class__.__name__}: {exc}")
        finally:
            await self._close_connection()

    async def _acquire(self) -> None:
        started = self.clock()
        deadline = started + ACQUIRE_LIMIT_S
        seen: tuple | None = None
        while self._renewing:
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
                *self.policy,
                self.url,
                self.share_mode,
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
            saved = await conn.fetchrow(_POLICY, timeout=RENEW_TIMEOUT_S * 2)
            if saved is None or tuple(saved) != (*self.policy, self.share_mode):
                raise StartupRefused(
                    f"the download policy changed while slot {self.slot} was being taken "
                    f"(saved now: {tuple(saved) if saved else 'none'}, checked: {tuple(self.policy)}; "
                    "was arkvory admin reset-download-policy run?): start the writer with the "
                    "wanted shared-download settings, then this process again"
                )
            holder = await conn.fetchrow(_OBSERVE, self.slot, timeout=RENEW_TIMEOUT_S * 2)
            if holder is None:
                continue  # the row vanished (reset racing with us): the policy check decides
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
            await self._nap(min(max(remaining, 0.0) + 0.05, POLL_S * 4))
        raise asyncio.CancelledError("the lease was closed while waiting for the slot")

    def _busy_message(self, holder: asyncpg.Record, why: str) -> str:
        return (
            f"slot {self.slot} is busy: held by pid {holder['pid']} on {holder['host']} "
            f"(generation {holder['generation']}), {why}; "
            "stop that process or choose another ARKVORY_GATEWAY_SLOT"
        )

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            try:
                self._conn = await db.open_connection(
                    self.database_url,
                    timeout=RENEW_TIMEOUT_S * 2,
                    # The server gives up on a renewal we no longer wait for.
                    server_settings={
                        "statement_timeout": str(int(RENEW_TIMEOUT_S * 1000)),
                        "application_name": f"arkvory-lease-slot-{self.slot}",
                    },
                )
            except db.CONNECT_ERRORS as exc:
                raise db.connect_failed(self.database_url, exc) from exc
        return self._conn

    async def _renew_until_stopped(self) -> None:
        # From the acquisition on: a slow start-up of the rest of the process costs nothing.
        next_send = self._trusted_until - TRUST_S + RENEW_EVERY_S
        while self._renewing and not self.lost.is_set():
            await self._nap(max(0.0, min(next_send, self._trusted_until) - self.clock()))
            if not self._renewing or self.lost.is_set():
                return
            if not self.trusted:
                self._lose("trust ran out before a renewal succeeded")
                return
            next_send = self.clock() + RENEW_EVERY_S
            await self._renew_once()

    async def _renew_once(self) -> None:
        sent = self.clock()
        try:
            conn = await asyncio.wait_for(self._connection(), self._time_left(sent))
            if self.shares is None:
                status = await asyncio.wait_for(
                    conn.execute(_RENEW, self.slot, self.holder_id, self.generation, RESERVATION_S),
                    self._time_left(sent),
                )
            else:
                renewed = self.shares.renew(conn, self.slot, self.holder_id, self.generation, RESERVATION_S)
                status = "UPDATE 1" if await asyncio.wait_for(renewed, self._time_left(sent)) else "UPDATE 0"
        except (OSError, TimeoutError, asyncpg.PostgresError, DatabaseUnavailable) as exc:
            self.report.renewal("failed")
            DATABASE.failed(LOOP, exc)  # the trust left decides; the outage is logged once
            self._drop_connection()
            return
        DATABASE.succeeded(LOOP)
        if status != "UPDATE 1":
            self.report.renewal("rejected")
            self._lose("the database refused the renewal (reservation expired or taken over)")
            return
        if self.clock() >= self._trusted_until:
            # A late answer never revives a lease whose local trust already ran out.
            self.report.renewal("late")
            self._lose("the renewal answered after local trust ran out")
            return
        if self.lost.is_set():
            return  # abandoned while the renewal was on its way: stays lost
        self.report.renewal("ok")
        self._trusted_until = sent + TRUST_S
        if self.shares is not None:
            self.shares.accepted()  # its grant is in force from now, trusted as the lease is

    async def _release(self) -> None:
        """Say in the lease row that this holder stopped on purpose (the reservation itself
        runs to its end: bytes already handed to the kernel may still be leaving). Bounded; a
        release that fails leaves the end counted as a loss, which is what it looks like."""

        async def release() -> str:
            conn = await self._connection()
            return await conn.execute(_RELEASE, self.slot, self.holder_id, self.generation)

        try:
            status = await asyncio.wait_for(release(), RENEW_TIMEOUT_S)
        except (OSError, TimeoutError, asyncpg.PostgresError, DatabaseUnavailable) as exc:
            log.warning("slot %d: could not mark the lease released (%s); its end will count as lost",
                        self.slot, describe_failure(exc))
            self._drop_connection()
            return
        if status != "UPDATE 1":
            log.warning("slot %d: the lease had already run out when released; it counts as lost", self.slot)

    def _time_left(self, sent: float) -> float:
        return max(0.01, min(RENEW_TIMEOUT_S - (self.clock() - sent), self._trusted_until - self.clock()))

    async def _nap(self, seconds: float) -> None:
        """Sleep, but wake at once for a stop or a loss."""
        assert self._wake is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)
        self._wake.clear()

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.terminate()  # never wait on a connection that just hung
            self._conn = None

    async def _close_connection(self) -> None:
        if self._conn is None:
            return
        if self.lost.is_set():
            self._drop_connection()
            return
        try:
            await asyncio.wait_for(self._conn.close(), 2.0)
        except (OSError, TimeoutError, asyncpg.PostgresError):
            self._conn.terminate()
        self._conn = None

    # -- loss (any thread) ----------------------------------------------------------------------

    def _lose(self, reason: str) -> None:
        with self._lose_once:
            if self.lost.is_set():
                return
            self.lost_reason = reason
            self._lost = True
            self.lost.set()
        self.report.lost()
        log.error("slot %d lease LOST: %s", self.slot, reason)
        if self._main_loop is not None and self._lost_signal is not None:
            with contextlib.suppress(RuntimeError):  # the serving loop is already closed
                self._main_loop.call_soon_threadsafe(self._lost_signal.set)
        self._wake_thread()

    def _wake_thread(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is None or wake is None:
            return
        if threading.current_thread() is self._thread:
            wake.set()
            return
        with contextlib.suppress(RuntimeError):  # the thread's loop already ended
            loop.call_soon_threadsafe(wake.set)
