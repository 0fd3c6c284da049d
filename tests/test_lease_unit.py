"""The slot lease on its own, against the real PostgreSQL: it renews from its own thread, so a
serving loop that is blocked for longer than the trust window never costs it (issue 6 §1), a
loss is decided by the thread even while the serving loop is blocked, and the acquisition is
conditional on the saved download policy (issue 6 §5)."""

from __future__ import annotations

import asyncio
import threading
import time

import asyncpg
import pytest

from arkvory.shared import db
from arkvory.shared.cluster.lease import RENEW_EVERY_S, TRUST_S, RenewalCounter, SlotLease
from arkvory.shared.errors import StartupRefused

pytestmark = pytest.mark.timeout(90)

TOTAL = 3 * 1_000_000
POLICY = (3, TOTAL, 0)


class Counted(RenewalCounter):
    """Renewal results; the renewal thread reports, the test reads."""

    def __init__(self) -> None:
        self.results: list[str] = []
        self.losses = 0
        self._lock = threading.Lock()

    def renewal(self, result: str) -> None:
        with self._lock:
            self.results.append(result)

    def lost(self) -> None:
        with self._lock:
            self.losses += 1


async def prepared(database_url: str, policy=POLICY) -> asyncpg.Connection:
    """A migrated database with a saved policy, and a connection the test looks through."""
    conn = await asyncpg.connect(database_url)
    await db.migrate(conn)
    await conn.execute(
        "INSERT INTO arkvory_download_policy"
        " (slots, total_bytes_per_second, per_principal_bytes_per_second) VALUES ($1, $2, $3)",
        *policy,
    )
    return conn


async def lease_row(conn: asyncpg.Connection, slot: int = 1):
    return await conn.fetchrow(
        "SELECT generation, acquired_at, renewed_at, expires_at > now() AS live"
        " FROM arkvory_gateway_leases WHERE slot = $1",
        slot,
        timeout=5,
    )


def test_a_blocked_event_loop_never_costs_the_lease(database_url):
    async def scenario():
        conn = await prepared(database_url)
        counted = Counted()
        lease = SlotLease(database_url, 1, "reader", POLICY, report=counted)
        try:
            await lease.start()
            acquired = await lease_row(conn)
            # This loop is the one that serves requests; a request stalls it for 12 s,
            # longer than the 8 s of trust.
            time.sleep(12)
            assert lease.trusted, lease.lost_reason
            assert not lease.lost.is_set()
            assert lease.trust_remaining() > TRUST_S - RENEW_EVERY_S - 1.5
            after = await lease_row(conn)
            assert after["live"] and after["generation"] == acquired["generation"]
            # Renewals kept their 2 s rhythm while we slept.
            assert (after["renewed_at"] - acquired["renewed_at"]).total_seconds() >= 12 - RENEW_EVERY_S - 1
            assert counted.results.count("ok") >= 5, counted.results
            assert "failed" not in counted.results and counted.losses == 0
        finally:
            await lease.close()
            await conn.close()

    asyncio.run(scenario())


def test_a_loss_is_decided_even_while_the_serving_loop_is_blocked(database_url):
    async def scenario():
        conn = await prepared(database_url)
        lease = SlotLease(database_url, 1, "reader", POLICY)
        try:
            await lease.start()
            # Another holder takes over (fencing): the next renewal is refused.
            await conn.execute("UPDATE arkvory_gateway_leases SET generation = generation + 1 WHERE slot = 1")
            time.sleep(RENEW_EVERY_S + 1.5)  # the serving loop is blocked all along
            assert lease.lost.is_set() and not lease.trusted
            assert lease.trust_remaining() == 0.0
            assert "refused" in (lease.lost_reason or "")
            # ... and the serving loop hears of it as soon as it runs again.
            await asyncio.wait_for(lease.wait_lost(), 1.0)
        finally:
            await lease.close()
            await conn.close()

    asyncio.run(scenario())


def test_acquisition_requires_the_saved_policy_to_still_match(database_url):
    async def scenario():
        conn = await prepared(database_url)
        try:
            # The process checked other numbers than the ones saved now (a reset and a new
            # writer between its check and its acquisition).
            other = SlotLease(database_url, 1, "reader", (3, 2 * TOTAL, 0))
            with pytest.raises(StartupRefused, match="download policy changed"):
                await other.start()
            await other.close()
            assert await lease_row(conn) is None
            # The policy was reset (deleted) after the check: no lease on deleted rows.
            await conn.execute("DELETE FROM arkvory_download_policy")
            gone = SlotLease(database_url, 1, "reader", POLICY)
            with pytest.raises(StartupRefused, match="reset-download-policy"):
                await gone.start()
            await gone.close()
            assert await lease_row(conn) is None
        finally:
            await conn.close()

    asyncio.run(scenario())
