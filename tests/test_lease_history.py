"""What the database knows of every slot's leases (issue 24 item 1), against the real PostgreSQL:
a planned stop releases the lease, a reservation that runs out unreleased is counted lost at
once and stays counted when the slot is taken again, and the payload chunks a process handed out
after its trust ended reach its slot's row on its way out. The processes that report it are
tests/test_monitoring_live.py's."""

from __future__ import annotations

import asyncio
import logging
import os

import asyncpg
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from arkvory.shared.auth.identity import KeyRing
from arkvory.shared.cluster.lease import SlotLease
from arkvory.shared.cluster.lease_history import LeaseHistory, record_payload_after_trust
from arkvory.shared.process.runtime import Runtime
from arkvory.shared.settings import Settings

from .test_lease_unit import POLICY, prepared
from .test_monitoring import value

pytestmark = pytest.mark.timeout(60)


async def history_of(conn: asyncpg.Connection) -> dict[str, dict[int, float]]:
    """The exported samples of a freshly read LeaseHistory: {metric: {slot: value}}."""
    history = LeaseHistory()
    await history.refresh(conn)
    registry = CollectorRegistry()
    registry.register(history)
    text = generate_latest(registry).decode()
    names = ("arkvory_slot_lease_generation", "arkvory_slot_leases_lost_total",
             "arkvory_slot_payload_after_trust_chunks_total")
    return {name: {slot: value(text, name, slot=str(slot)) for slot in range(POLICY[0])} for name in names}


async def expire(conn: asyncpg.Connection, slot: int) -> None:
    """The reservation runs out now (instead of up to 10 s after the last renewal)."""
    await conn.execute("UPDATE arkvory_gateway_leases SET expires_at = now() WHERE slot = $1", slot)


async def released(conn: asyncpg.Connection, slot: int) -> bool:
    return await conn.fetchval("SELECT released_at IS NOT NULL FROM arkvory_gateway_leases WHERE slot = $1", slot)


def on_prepared_database(database_url: str, scenario) -> None:
    """Run `scenario(conn)` against a migrated database with a saved policy of 3 slots."""

    async def run() -> None:
        conn = await prepared(database_url)
        try:
            await scenario(conn)
        finally:
            await conn.close()

    asyncio.run(run())


def test_nothing_is_exported_before_the_first_read_then_every_slot_of_the_policy(database_url):
    history = LeaseHistory()
    registry = CollectorRegistry()
    registry.register(history)
    text = generate_latest(registry).decode()
    # A made-up 0 followed by the real count would look like that many new losses.
    assert "arkvory_slot_leases_lost_total{" not in text and "arkvory_slot_lease_generation{" not in text

    async def scenario(conn: asyncpg.Connection) -> None:
        assert await history_of(conn) == {
            "arkvory_slot_lease_generation": {0: 0, 1: 0, 2: 0},
            "arkvory_slot_leases_lost_total": {0: 0, 1: 0, 2: 0},
            "arkvory_slot_payload_after_trust_chunks_total": {0: 0, 1: 0, 2: 0},
        }
        await conn.execute("DELETE FROM arkvory_download_policy")  # standalone: no slots
        standalone = LeaseHistory()
        await standalone.refresh(conn)
        assert standalone.slots == []

    on_prepared_database(database_url, scenario)


def test_a_planned_stop_releases_the_lease_and_is_never_counted_lost(database_url):
    async def scenario(conn: asyncpg.Connection) -> None:
        lease = SlotLease(database_url, 1, "reader", POLICY)
        await lease.start()
        lease.stop_renewing()  # what a drained process does
        await lease.close()
        assert await released(conn, 1)
        await expire(conn, 1)  # its reservation runs out, released
        counts = await history_of(conn)
        assert counts["arkvory_slot_leases_lost_total"][1] == 0
        # Its successor takes the slot: one more acquisition, still no loss.
        successor = SlotLease(database_url, 1, "reader", POLICY)
        await successor.start()
        await successor.close()
        assert await released(conn, 1)
        counts = await history_of(conn)
        assert counts["arkvory_slot_lease_generation"][1] == 2
        assert counts["arkvory_slot_leases_lost_total"] == {0: 0, 1: 0, 2: 0}

    on_prepared_database(database_url, scenario)


def test_a_reservation_that_runs_out_unreleased_is_lost_at_once_and_stays_counted(database_url):
    async def scenario(conn: asyncpg.Connection) -> None:
        lease = SlotLease(database_url, 1, "reader", POLICY)
        await lease.start()
        # The database clock ends the reservation before a renewal (a stalled database, a
        # frozen host): the next renewal is refused and the lease is lost.
        await expire(conn, 1)
        await asyncio.wait_for(lease.wait_lost(), 5)
        await lease.close()
        assert not await released(conn, 1)
        # Counted as soon as the reservation ran out: no successor needed.
        counts = await history_of(conn)
        assert counts["arkvory_slot_leases_lost_total"] == {0: 0, 1: 1, 2: 0}
        # The successor's acquisition moves the loss into the row's count: still 1, never 0
        # in between (one statement), so no reporter sees the counter go down.
        successor = SlotLease(database_url, 1, "reader", POLICY)
        await successor.start()
        counts = await history_of(conn)
        assert counts["arkvory_slot_leases_lost_total"][1] == 1
        assert counts["arkvory_slot_lease_generation"][1] == 2
        assert await conn.fetchval("SELECT unreleased_ends FROM arkvory_gateway_leases WHERE slot = 1") == 1
        # A crash: the process stops renewing and never releases; its reservation runs out.
        successor.abandon("the process crashed")
        await successor.close()
        await expire(conn, 1)
        assert (await history_of(conn))["arkvory_slot_leases_lost_total"][1] == 2
        third = SlotLease(database_url, 1, "reader", POLICY)
        await third.start()
        await third.close()
        counts = await history_of(conn)
        assert counts["arkvory_slot_leases_lost_total"] == {0: 0, 1: 2, 2: 0}
        assert counts["arkvory_slot_lease_generation"][1] == 3

    on_prepared_database(database_url, scenario)


def test_a_release_after_the_reservation_ran_out_does_not_undo_the_loss(database_url, caplog):
    """A process frozen past its reservation may already have been reported lost: releasing it
    then would make the count go down, so the release needs a live reservation."""

    async def scenario(conn: asyncpg.Connection) -> None:
        lease = SlotLease(database_url, 2, "reader", POLICY)
        await lease.start()
        # Just after a renewal (the next is 2 s away), the reservation runs out and only then
        # comes the planned stop.
        renewed = "SELECT renewed_at FROM arkvory_gateway_leases WHERE slot = 2"
        acquired = await conn.fetchval(renewed)
        for _ in range(100):
            if await conn.fetchval(renewed) != acquired:
                break
            await asyncio.sleep(0.05)
        await expire(conn, 2)
        assert (await history_of(conn))["arkvory_slot_leases_lost_total"][2] == 1
        with caplog.at_level(logging.WARNING, logger="arkvory.lease"):
            lease.stop_renewing()
            await lease.close()
        assert not lease.lost.is_set()  # a planned stop, only too late
        assert not await released(conn, 2)
        assert (await history_of(conn))["arkvory_slot_leases_lost_total"][2] == 1

    on_prepared_database(database_url, scenario)
    assert "already run out when released" in caplog.text


class _LateChunks(Collector):
    def __init__(self, chunks: int) -> None:
        self.chunks = chunks

    def collect(self):
        yield CounterMetricFamily("arkvory_payload_chunks_after_trust", "audit", value=self.chunks)


def test_payload_after_trust_reaches_the_slot_s_row_on_the_way_out(database_url, refused_url, caplog):
    async def scenario(conn: asyncpg.Connection) -> None:
        lease = SlotLease(database_url, 1, "reader", POLICY)
        await lease.start()
        await lease.close()
        none = CollectorRegistry()
        none.register(_LateChunks(0))
        assert await record_payload_after_trust(none, database_url, 1) is None
        late = CollectorRegistry()
        late.register(_LateChunks(3))
        with caplog.at_level(logging.ERROR, logger="arkvory.lease"):
            assert await record_payload_after_trust(late, database_url, 1) is True
            assert await record_payload_after_trust(late, database_url, 1) is True
        assert (await history_of(conn))["arkvory_slot_payload_after_trust_chunks_total"] == {0: 0, 1: 6, 2: 0}
        # The database unreachable: the log is the only record, at CRITICAL.
        unreachable = refused_url().replace("http://", "postgresql://arkvory@") + "/arkvory"
        with caplog.at_level(logging.ERROR, logger="arkvory.lease"):
            assert await record_payload_after_trust(late, unreachable, 1) is False

    on_prepared_database(database_url, scenario)
    critical = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert len(critical) == 1 and "this log is their only record" in critical[0].getMessage()


def test_a_runtime_records_its_payload_after_trust_when_it_closes(database_url, tmp_path):
    """The wiring: Runtime.close() hands the protocol's count (read from its registry) to the
    slot's row; a standalone process (no slot) has nothing to record."""
    settings = Settings.from_env({
        "ARKVORY_DATABASE_URL": database_url, "ARKVORY_DATA_DIR": str(tmp_path), "ARKVORY_ROLE": "reader",
        "ARKVORY_GATEWAY_SLOTS": str(POLICY[0]), "ARKVORY_GATEWAY_SLOT": "1",
        "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND": str(POLICY[1]),
    })

    async def scenario(conn: asyncpg.Connection) -> None:
        lease = SlotLease(database_url, 1, "reader", POLICY)
        await lease.start()
        await lease.close()
        runtime = Runtime(settings, KeyRing.empty())
        runtime.registry.register(_LateChunks(2))
        await runtime.close()
        assert (await history_of(conn))["arkvory_slot_payload_after_trust_chunks_total"][1] == 2

    on_prepared_database(database_url, scenario)


def test_the_count_runtime_close_records_is_the_one_the_protocol_exports(tmp_path):
    """record_payload_after_trust reads the protocol's audit from the registry by its name: the
    HTTP edge must export it under that name (0 from the start), or nothing would be recorded."""
    from arkvory.shared.http.protocol import protocol_for

    settings = Settings.from_env({"ARKVORY_DATABASE_URL": "postgresql://arkvory@127.0.0.1:1/arkvory",
                                  "ARKVORY_DATA_DIR": str(tmp_path)})
    runtime = Runtime(settings, KeyRing.empty())
    protocol_for(runtime)
    assert runtime.registry.get_sample_value("arkvory_payload_chunks_after_trust_total") == 0


def test_the_migration_counts_no_loss_for_leases_from_before_it(database_url):
    """Rows of a database migrated from an earlier version: how those leases ended is unknown,
    so they are taken as released (an upgrade stops every process first)."""

    async def scenario():
        from arkvory.shared import db

        conn = await asyncpg.connect(database_url)
        try:
            (ours,) = [m for m in db.migrations() if m[1].endswith("_lease_endings.sql")]
            for version, _name, sql in db.migrations():
                if version < ours[0]:
                    await conn.execute(sql)
            await conn.execute(
                "INSERT INTO arkvory_download_policy (slots, total_bytes_per_second, per_principal_bytes_per_second)"
                " VALUES ($1, $2, $3)", *POLICY,
            )
            await conn.execute(
                "INSERT INTO arkvory_gateway_leases (slot, holder_id, generation, pid, host, role, acquired_at,"
                " renewed_at, expires_at) VALUES (1, gen_random_uuid(), 7, $1, 'h', 'reader', now(), now(), now())",
                os.getpid(),
            )
            await conn.execute(ours[2])
            counts = await history_of(conn)
            assert counts["arkvory_slot_leases_lost_total"] == {0: 0, 1: 0, 2: 0}
            assert counts["arkvory_slot_lease_generation"][1] == 7
        finally:
            await conn.close()

    asyncio.run(scenario())
