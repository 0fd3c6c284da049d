"""Demand shares (SPEC §4 "Demand mode"): with every lease renewal a process reports what it could
use and receives the share the database grants it, of the total and of each principal's total.

Safety argument. The claim: bytes handed out by all processes together in any interval stay
≤ total × elapsed + Σ bursts, with Σ bursts no more than in static mode; the same per principal.

1. The database keeps, per live slot j, `committed(j) = max(granted_j, held_j while held_until_j
   is ahead)`, and for a slot whose reservation has expired, 0. Every slot's *floor* (total / (20 ×
   slots)) is reserved whether the slot is live or not; only the rest is divided by demand. All
   renewals take one row lock first (the policy row), so each allocation sees every earlier one.
   A decrease keeps what the process may still use (its `may_use`, see 3) as `held`; an
   increase takes only what the other live slots do not commit. So Σ committed ≤ total at
   every instant, by induction over the renewals.
2. A process uses a rate only while it trusts its lease (the payload gate asks before every
   chunk), and only a rate the database granted it in an answer the lease accepted (never one it
   raised itself; a renewal that failed, timed out or came late changes nothing).
3. Every rate the process may use is ≤ committed(its slot) for as long as it may use it: it
   reports `may_use` = the larger of the rate its buckets apply and the last grant it received
   (which the serving loop may not have applied yet) with every renewal; until it hears the
   answer it uses no more than that, and after it no more than that or the answer's grant.
   The only thing that lowers `may_use` below the last grant is the process itself giving part
   of that grant back (`release`: its demand fell), and it lowers its buckets before the next
   report says so. The database clears `held` only when `may_use` ≤ granted (the process
   confirmed the smaller share); otherwise, and on a decrease below `may_use`, it holds
   `max(held, may_use)` until now + 10 s. A grant whose answer was lost was never received, so
   it is never used. The process trusts a renewal for 8 s from when it *sent* it, so any rate
   it still uses ends before the hold does, and capacity taken from it reaches another slot only
   after it confirmed the decrease or could no longer use it. A renewal number per holder makes
   the database ignore a statement that arrives after a newer one (a timed-out renewal whose
   connection we dropped), so reports are applied in order.
4. A process killed or frozen holding a large grant: its trust ends by its own clock at most 8 s
   after its last renewal was sent, the reservation (and with it every hold) at most 10 s after
   the database received it; its capacity is free from then on, not before. A new holder of the
   slot starts from its floor (its generation differs), never from the old grant.
5. Bursts: a bucket's size stays what static mode gives it (a tenth of a second of the static
   share, at most 1 MiB), whatever its current rate; a rate change first refills at the old rate
   up to that instant, then continues at the new one, and never adds credit. So over any
   interval a bucket hands out ≤ its credit at the start (≤ its static burst) + ∫ rate, and
   Σ over processes ≤ Σ static bursts + total × elapsed. Credit carried from a high rate into a
   period whose capacity went elsewhere is part of that slot's own static burst, never more.
6. A database that does not answer: renewals fail, grants run out with the lease (8 s), and the
   process stops all payload; no process ever raises its own share locally.
7. Hints change nothing of the above: a renewal that comes out short NOTIFYs the slots that
   commit more than their part (demand.py `wanted_back`), and one that hears it only lowers its
   own rate (a `release`) and renews sooner; what it frees, it frees by its own report (3).

The same holds for each principal's rows (`arkvory_principal_shares`): a process reports every
principal that downloads with it or that it may still give more than the principal floor, and a
principal it leaves out is one it uses only its floor for.

Where it runs: `renew` and `accepted` in the lease's thread (shared/cluster/lease.py), one
statement per renewal (`arkvory_renew_share`, migration 0016); `report`, `applied` and a release
are written by the serving loop (shared/download/demand.py) as whole new objects, so the lease
thread reads a consistent snapshot with plain attribute reads (a release before the lowered
`applied`, which the lease thread reads first: it sees the old rate or both).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Mapping

import asyncpg

# Each slot's reserved floor is this fraction of an equal share: idle processes keep a twentieth,
# so one busy process of three gets ≥ 0.96 of the total, one of sixteen ≥ 0.95.
FLOOR_PARTS = 20

_RENEW_SHARE = """
SELECT renewed, process_granted, process_target, principal_ids, principal_granted, principals_short, took
FROM arkvory_renew_share($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
"""


def floor_for(total: int, slots: int) -> int:
    """The rate every slot may use from its acquisition on without a grant (as the SQL computes)."""
    return total // (FLOOR_PARTS * slots)


@dataclasses.dataclass(frozen=True)
class DemandReport:
    """What the serving loop measured, sent with the next renewal (bytes per second)."""

    demand: int = 0
    weight: int = 0  # downloads sending or waiting: the total is divided in proportion
    principals: Mapping[str, tuple[int, int]] = dataclasses.field(default_factory=dict)  # id -> (demand, weight)


@dataclasses.dataclass(frozen=True)
class Grant:
    """A share the database granted (before local limits); principals absent get their floor."""

    process: int
    principals: Mapping[str, int] = dataclasses.field(default_factory=dict)
    target: int = 0  # what the fair division would give: above `process` while others still hold it
    principals_short: int = 0  # principals granted less than their fair part, for the same reason

    @property
    def short(self) -> bool:
        return self.target > self.process or self.principals_short > 0


@dataclasses.dataclass(frozen=True)
class Applied:
    """The rates the buckets use now (after local limits); principals absent use the default."""

    process: int
    principals: Mapping[str, int]
    principal_default: int | None


class ShareExchange:
    """One process's end of the demand-mode renewal: the report it sends, the grant it keeps.

    `local_limit`/`local_principal_limit`: ARKVORY_DOWNLOAD_BYTES_PER_SECOND(_PER_PRINCIPAL), 0 =
    none; they only ever lower a grant. `on_grant` is called in the lease thread with every grant
    the lease accepted (the runtime hands it to the serving loop from there).
    """

    def __init__(
        self,
        total: int,
        per_principal_total: int,
        slots: int,
        *,
        local_limit: int = 0,
        local_principal_limit: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        self.per_principal_total = per_principal_total
        self.slots = slots
        self.floor = floor_for(total, slots)
        self.principal_floor = floor_for(per_principal_total, slots) if per_principal_total else 0
        self.local_limit = local_limit
        self.local_principal_limit = local_principal_limit
        self.clock = clock
        self.on_grant: Callable[[Grant], None] | None = None
        # Written by the serving loop, read by the lease thread (whole objects: one read each).
        self.report = DemandReport()
        self.applied = Applied(self.effective(self.floor), {}, self.principal_default())
        # Written by the serving loop: a grant it gave part of back (`release`), and how much it
        # still uses of it.
        self._released: tuple[Grant, int] | None = None
        # Written by the lease thread.
        self.received = Grant(self.floor, {}, self.floor)
        self.last_report = DemandReport()
        self.last_sent: float | None = None
        # The last renewal's time in the database, its lock wait included (without an answer: the
        # time until it was given up, as far as we can tell).
        self.last_took = 0.0
        self.in_flight = False
        self.renewals = 0
        self._seq = 0
        self._pending: Grant | None = None
        self._lock = threading.Lock()  # `renew` runs in one thread, but tests call it from several

    # -- local limits ------------------------------------------------------------------------

    def effective(self, granted: int) -> int:
        """A granted process rate after the local limit."""
        return min(granted, self.local_limit) if self.local_limit else granted

    def effective_principal(self, granted: int) -> int:
        return min(granted, self.local_principal_limit) if self.local_principal_limit else granted

    def usable(self, grant: Grant) -> int:
        """The process rate this process may apply for `grant`: after the local limit, and no
        more than it released of that grant."""
        rate = self.effective(grant.process)
        released = self._released
        if released is not None and released[0] is grant:
            rate = min(rate, released[1])
        return rate

    def release(self, rate: int) -> None:
        """The serving loop, whose demand fell, uses no more than `rate` of the grant it holds
        until a newer one arrives (it lowers its buckets right after): the next renewal reports
        that as what it may use, so the database frees the rest in one renewal instead of two
        (a decrease, then its confirmation). A grant accepted meanwhile is not touched."""
        self._released = (self.received, rate)

    def principal_default(self) -> int | None:
        """The rate of a principal without a grant of its own: its floor (or the local limit
        alone when principals have no shared total)."""
        if self.per_principal_total:
            return self.effective_principal(self.principal_floor)
        return self.local_principal_limit or None

    def ceiling(self) -> int:
        """The most this process could ever use: the total, lowered by its local limit."""
        return self.effective(self.total)

    def principal_ceiling(self) -> int:
        return self.effective_principal(self.per_principal_total) if self.per_principal_total else 0

    # -- the lease thread ----------------------------------------------------------------------

    def arguments(self, slot: int, holder_id: uuid.UUID, generation: int, reservation_s: float) -> tuple:
        """The renewal's parameters: a new renewal number, the latest report and what this
        process may use until it hears again."""
        with self._lock:
            self._seq += 1
            seq = self._seq
        report, received = self.report, self.received
        applied = self.applied  # read after `received`: both come from the grants received so far
        may_use = max(applied.process, self.usable(received))
        principal_may_use = self._principal_may_use(applied, received)
        ids: list[str] = []
        demands: list[int] = []
        weights: list[int] = []
        uses: list[int] = []
        floor = self.principal_default() or 0
        if self.per_principal_total:
            for principal_id in set(report.principals) | set(principal_may_use):
                demand, weight = report.principals.get(principal_id, (0, 0))
                use = principal_may_use.get(principal_id, floor)
                if demand <= 0 and use <= floor:
                    continue  # left out: the database then counts only its floor here
                ids.append(principal_id)
                demands.append(min(demand, self.per_principal_total))
                weights.append(weight)
                uses.append(use)
        self.last_report = report
        return (
            slot, holder_id, generation, seq, reservation_s,
            min(report.demand, self.total), report.weight, may_use,
            ids, demands, weights, uses,
        )

    def _principal_may_use(self, applied: Applied, received: Grant) -> dict[str, int]:
        uses = dict(applied.principals)
        for principal_id, rate in received.principals.items():
            rate = self.effective_principal(rate)
            if rate > uses.get(principal_id, 0):
                uses[principal_id] = rate
        return uses

    async def renew(self, conn: asyncpg.Connection, slot: int, holder_id: uuid.UUID, generation: int,
                    reservation_s: float) -> bool:
        """The lease's renewal in demand mode: True when the database renewed it. The grant in
        the answer is kept aside until the lease accepts the renewal (`accepted`)."""
        self._pending = None
        arguments = self.arguments(slot, holder_id, generation, reservation_s)
        self.last_sent = self.clock()
        self.in_flight = True
        row = None
        try:
            row = await conn.fetchrow(_RENEW_SHARE, *arguments)
        finally:
            self.in_flight = False
            took = row["took"] if row is not None else None
            self.last_took = took if took is not None else self.clock() - self.last_sent
        return self.answered(row)

    def answered(self, row: Mapping | None) -> bool:
        """The statement's answer: True when it renewed; its grant waits for `accepted`."""
        self._pending = None
        if row is None or not row["renewed"]:
            return False
        self._pending = grant_from_row(row)
        return True

    def accepted(self) -> None:
        """The lease trusts the renewal whose answer `renew` kept: its grant is in force."""
        grant, self._pending = self._pending, None
        if grant is None:
            return
        self.received = grant
        self.renewals += 1
        if self.on_grant is not None:
            self.on_grant(grant)


def grant_from_row(row: Mapping) -> Grant:
    ids = row["principal_ids"] or []
    rates = row["principal_granted"] or []
    return Grant(
        process=int(row["process_granted"]),
        principals=dict(zip(ids, (int(rate) for rate in rates), strict=True)),
        target=int(row["process_target"]),
        principals_short=int(row["principals_short"] or 0),
    )
