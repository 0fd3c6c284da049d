"""What the database knows of every slot's leases (issue 24 item 1), exported by every process
(writer, gateways, worker) so that a lost lease is reported by the processes that survive it.

A process that loses its lease exits 75 two seconds later (SPEC §4): its own
`arkvory_leases_lost_total` is seen only by a scrape that lands in those seconds. The lease row
remembers instead (lease.py): a holder that stops on purpose marks it released, and a
reservation that runs out unreleased is a lost lease (the holder could not renew in time, or it
crashed, was killed or froze). Every process reads the rows, so a loss is reported by the worker
(which holds no slot), the other gateways, the writer and the restarted process itself; the alert
takes the max over them by slot (deploy/prometheus/alerts.yml, ArkvoryLeaseLost).

    arkvory_slot_lease_generation{slot}                   the slot's acquisitions so far (its
                                                          lease's generation; 0 = never held)
    arkvory_slot_leases_lost_total{slot}                  its reservations that ran out unreleased
    arkvory_slot_payload_after_trust_chunks_total{slot}   payload chunks its holders handed out
                                                          after their trust ended (must stay 0),
                                                          as each recorded them on its way out

The lost count is the row's `unreleased_ends` plus one while its reservation has run out
unreleased and no process has taken the slot yet. The acquisition that adds one to the first
removes the second in the same statement, so the count never goes down, and it goes up when the
reservation runs out (database clock), whether or not the slot is ever taken again.

The rows are read every REFRESH_S by a supervised loop (a scrape never queries the database), and
nothing is exported before the first read: a made-up 0 followed by the real count would look like
that many new losses. Every slot of the saved policy is exported, 0 for one never held; a
standalone installation has no policy and no slots.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import anyio
import asyncpg
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from arkvory.shared import db
from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S

from .supervision import DATABASE_ERRORS, describe_failure, read_every

log = logging.getLogger("arkvory.lease")

REFRESH_S = 5.0
RECORD_TIMEOUT_S = 2.0
LOOP = "lease history"  # as named in the process's database outage lines

_SLOTS = """
SELECT s.slot,
       coalesce(l.generation, 0) AS generation,
       coalesce(l.unreleased_ends + (l.released_at IS NULL AND l.expires_at <= now())::int, 0) AS lost,
       coalesce(l.payload_after_trust_chunks, 0) AS late_chunks
FROM arkvory_download_policy AS policy
CROSS JOIN generate_series(0, policy.slots - 1) AS s(slot)
LEFT JOIN arkvory_gateway_leases AS l ON l.slot = s.slot
ORDER BY s.slot
"""
_RECORD_LATE_CHUNKS = """
UPDATE arkvory_gateway_leases SET payload_after_trust_chunks = payload_after_trust_chunks + $2
WHERE slot = $1
"""


class LeaseHistory(Collector):
    """The slots' lease history as last read from the database, exported at scrape time."""

    def __init__(self) -> None:
        # (slot, generation, lost, late chunks) per slot of the policy; None until first read.
        self.slots: list[tuple[int, int, int, int]] | None = None

    async def refresh(self, conn: asyncpg.Connection) -> None:
        rows = await conn.fetch(_SLOTS, timeout=POOLED_QUERY_TIMEOUT_S)
        self.slots = [(row["slot"], row["generation"], row["lost"], row["late_chunks"]) for row in rows]

    async def run(self, pool_of: Callable[[], Any], *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Read every REFRESH_S from a pool connection (`pool_of()` gives the pool), the first
        time before `started()`; a read that fails keeps the last values."""
        await read_every(REFRESH_S, LOOP, pool_of, self.refresh, task_status=task_status)

    def collect(self):
        generation = GaugeMetricFamily(
            "arkvory_slot_lease_generation",
            "Acquisitions of each slot's lease so far, from the database (its generation: one more at"
            " every start of the slot's process; 0 = never held)",
            labels=["slot"],
        )
        lost = CounterMetricFamily(
            "arkvory_slot_leases_lost",
            "Leases of each slot whose reservation ran out without its holder releasing it (lost:"
            " the database unreachable or slow, a frozen host; or the process crashed or was"
            " killed), from the database: every process reports every slot",
            labels=["slot"],
        )
        late = CounterMetricFamily(
            "arkvory_slot_payload_after_trust_chunks",
            "Payload chunks the holders of each slot handed to a connection after their lease's"
            " trust ended, as each recorded them in the database on its way out (must stay 0)",
            labels=["slot"],
        )
        for slot, acquisitions, losses, late_chunks in self.slots or ():
            generation.add_metric([str(slot)], acquisitions)
            lost.add_metric([str(slot)], losses)
            late.add_metric([str(slot)], late_chunks)
        yield generation
        yield lost
        yield late


async def record_payload_after_trust(registry: CollectorRegistry, database_url: str, slot: int) -> bool | None:
    """On the way out: add the payload chunks the protocol's audit found handed out after the
    lease's trust ended (`arkvory_payload_chunks_after_trust_total` of this process's `registry`)
    to its slot's row, so every other process reports them after this one exited. On a connection
    of its own (the pool may be gone), within RECORD_TIMEOUT_S. None when there were none; else
    whether they were recorded (the log says so either way, at CRITICAL when they were not)."""
    chunks = int(registry.get_sample_value("arkvory_payload_chunks_after_trust_total") or 0)
    if not chunks:
        return None

    async def record() -> None:
        conn = await db.connect(database_url, timeout=RECORD_TIMEOUT_S)
        try:
            await conn.execute(_RECORD_LATE_CHUNKS, slot, chunks, timeout=RECORD_TIMEOUT_S)
        finally:
            conn.terminate()

    try:
        await asyncio.wait_for(record(), RECORD_TIMEOUT_S)
    except DATABASE_ERRORS as exc:
        log.critical(
            "slot %d handed out %d payload chunk(s) after its lease's trust ended, and they could not be"
            " recorded in the database (%s): this log is their only record (ArkvoryPayloadAfterTrust)",
            slot, chunks, describe_failure(exc),
        )
        return False
    log.error(
        "slot %d handed out %d payload chunk(s) after its lease's trust ended: recorded in the database,"
        " every process reports it (arkvory_slot_payload_after_trust_chunks_total)", slot, chunks,
    )
    return True
