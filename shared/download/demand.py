"""Demand mode on the serving loop (SPEC §4): measure what this process could use, apply the shares
the database grants to the token buckets, and ask the lease for an early renewal when the demand
moved. Why no process ever exceeds its part is argued in shared/cluster/grants.py.

Nothing here runs per request or per chunk: a tick ten times a second reads counters the
serving path keeps anyway (bytes granted, time spent waiting for tokens, admission), and a grant
changes the buckets' rates in place when the lease thread hands it over.

What "demand" is (docs/operations.md gives the numbers):
  * no download sending or waiting: 0 (the process keeps its floor, so the next one starts at once);
  * downloads waiting for a place, transfers that waited for tokens ≥ 5 % of the last second, or
    downloads that started within it (none at its start): the process could use more than it
    has, so it asks for its ceiling (the total, lowered by a local
    ARKVORY_DOWNLOAD_BYTES_PER_SECOND, and by the principals' totals when those are set);
  * otherwise its clients read slower than its share: 1.25 × what it sent in the last second,
    and it lowers its own buckets to that at once (`_release_unused`), so that its next renewal
    frees the rest for the others.
The weight is the number of downloads sending or waiting: the total is divided in proportion to
downloads, so clients spread unevenly over the processes still get even rates. Each principal
with downloads here (when principals have a total) is measured the same way, from what its
bucket granted it (a count kept in place of the process's, not beside it) and whether that
bucket was short at the ticks: bound by its own rate, or new here, it asks for its total; its
clients reading slowly, 1.25 × what it was granted.

Early renewals (`_renew_early`) follow a change of demand, a smaller share applied (so the
database frees the rest), and a hint from another slot whose renewal came out short
(WANTED_CHANNEL, heard on the control connection: `wanted_back` lowers this process's buckets
to the part named and renews at once); they are rationed by what the allocation costs
(`early_gap`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import anyio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from arkvory.shared.cluster.grants import Applied, DemandReport, ShareExchange
from arkvory.shared.metrics import Metrics

from .admission import Admission
from .throttle import BandwidthScheduler

log = logging.getLogger("arkvory.demand")

TICK_S = 0.1
WINDOW_S = 1.0  # the moving window demand is measured over
BOUND_WAITING = 0.05  # transfers waited for tokens this share of the window: they would take more
HEADROOM = 1.25  # a process whose clients read slowly asks for this much more than it sent
MIN_GAP_S = 0.1  # never two renewals closer than this
# Early renewals of all slots together keep the allocation (one row lock, shared/cluster/grants.py)
# busy at most this share of the time: between two of them a process waits at least slots × its
# last renewal's time in the database (lock wait included) ÷ this. A slow or contended database:
# fewer.
EARLY_LOCK_SHARE = 0.25
SHORT_RETRY_S = 0.1  # ask again this often while a part promised to us is still held elsewhere
MOVED = 1.5  # demand changed by this factor since the last report: tell the database now


# NOTIFY'd by a renewal that came out short (migration 0016): "slot:part,…" of the slots that
# commit more than their part of that division.
WANTED_CHANNEL = "arkvory_shares_wanted"


class Renewing(Protocol):
    """The lease as demand mode needs it (shared/cluster/lease.py)."""

    slot: int

    def renew_soon(self) -> None: ...


Usage = Mapping[str, tuple[int, bool]]  # principal -> (bytes granted so far, its own bucket short now)


def early_gap(exchange: ShareExchange) -> float:
    """The shortest time from one renewal to an early one."""
    return max(MIN_GAP_S, exchange.slots * exchange.last_took / EARLY_LOCK_SHARE)


class DemandMeter:
    """Turns the counters sampled every tick into a `DemandReport` (pure: the clock is the caller's)."""

    def __init__(self, exchange: ShareExchange) -> None:
        self.exchange = exchange
        self._samples: deque[tuple[float, int, float, Usage, int]] = deque()  # (…, downloads then)

    def measure(
        self, now: float, granted_bytes: int, wait_seconds: float, active: int, waiting: int,
        by_principal: dict[str, int], usage: Usage | None = None,
    ) -> DemandReport:
        """`usage`: the scheduler's `principal_usage` of the principals in `by_principal` (only
        with principals' totals)."""
        samples = self._samples
        busy = active + waiting
        samples.append((now, granted_bytes, wait_seconds, usage or {}, busy))
        while len(samples) > 2 and now - samples[1][0] >= WINDOW_S:
            samples.popleft()
        if not busy:
            return DemandReport()
        since, granted_then, waited_then, _, busy_then = samples[0]
        span = now - since
        exchange = self.exchange
        ceiling = exchange.ceiling()
        principal_ceiling = exchange.principal_ceiling()
        if principal_ceiling:
            ceiling = min(ceiling, principal_ceiling * len(by_principal))
        # Downloads that started within the window (none at its start) are new here: what they
        # can take is not known yet, so they ask for the ceiling, as a new principal does.
        bound = waiting > 0 or not busy_then or (span > 0 and (wait_seconds - waited_then) / span >= BOUND_WAITING)
        if bound or span <= 0:
            demand = ceiling
        else:
            demand = min(ceiling, int((granted_bytes - granted_then) / span * HEADROOM))
        principals = self._principal_demands(by_principal, span) if principal_ceiling else {}
        return DemandReport(demand, busy, principals)

    def _principal_demands(self, by_principal: dict[str, int], span: float) -> dict[str, tuple[int, int]]:
        """Each downloading principal's demand and downloads, measured like the process's: its
        ceiling while its own bucket holds it back (short at half the ticks of the window or
        more) or while it is new here; else 1.25 × what it was granted over the window (its
        clients read slower than its rate)."""
        ceiling = self.exchange.principal_ceiling()
        samples = self._samples
        first, now = samples[0][3], samples[-1][3]
        ticks = [sample[3] for sample in list(samples)[1:]]  # the window's ticks, this one included
        demands = {}
        for principal_id, count in by_principal.items():
            then, current = first.get(principal_id), now.get(principal_id)
            if then is None or current is None or current[0] < then[0] or span <= 0:
                demands[principal_id] = (ceiling, count)  # new here (or dropped and made again)
                continue
            short = sum(1 for tick in ticks if tick.get(principal_id, (0, True))[1])
            if 2 * short >= len(ticks):
                demands[principal_id] = (ceiling, count)
            else:
                demands[principal_id] = (min(ceiling, int((current[0] - then[0]) / span * HEADROOM)), count)
        return demands


class DemandShares:
    """The serving loop's side of demand mode for one process."""

    def __init__(
        self,
        exchange: ShareExchange,
        bandwidth: BandwidthScheduler,
        admission: Admission,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.exchange = exchange
        self.bandwidth = bandwidth
        self.admission = admission
        self.metrics = metrics
        self.clock = clock
        self.meter = DemandMeter(exchange)
        self.redivisions = 0
        self._lease: Renewing | None = None
        self._confirm_due = False  # a decrease was applied: tell the database, so it frees it
        self._wanted = False  # another slot waits for part of ours: renew as soon as we may
        self.apply()  # the floor, from the start
        observe_shares(
            metrics, exchange.total, lambda: self.exchange.last_report.demand, lambda: self.redivisions
        )

    def attach(self, lease: Renewing, loop: asyncio.AbstractEventLoop) -> None:
        """Before the lease starts: grants reach `apply` on this loop, early renewals go to `lease`."""
        self._lease = lease

        def hand_over(_grant: Any) -> None:  # in the lease thread
            try:
                loop.call_soon_threadsafe(self.apply)
            except RuntimeError:  # the serving loop is closed: nothing serves any more
                pass

        self.exchange.on_grant = hand_over

    # -- applying a grant (serving loop) -----------------------------------------------------

    def apply(self) -> None:
        """Put the latest grant the lease accepted into the buckets, then say so (`applied`)."""
        exchange = self.exchange
        grant = exchange.received
        before = exchange.applied
        rate = exchange.usable(grant)
        default = exchange.principal_default()
        principals = (
            {p: exchange.effective_principal(r) for p, r in grant.principals.items()}
            if exchange.per_principal_total else {}
        )
        self.bandwidth.set_rates(rate, principals, default)
        exchange.applied = Applied(rate, principals, default)
        if rate != before.process or principals != dict(before.principals):
            self.redivisions += 1
        if rate < before.process or any(
            principals.get(p, default or 0) < r for p, r in before.principals.items()
        ):
            self._confirm_due = True
        share = self.metrics.share_bytes_per_second
        share.labels(scope="process").set(rate)
        share.labels(scope="principal").set(max(principals.values(), default=default or 0))

    # -- the tick (serving loop) -------------------------------------------------------------

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            self.tick()
            await asyncio.sleep(TICK_S)

    def tick(self) -> None:
        now = self.clock()
        bandwidth, admission = self.bandwidth, self.admission
        by_principal = admission.by_principal()
        usage = bandwidth.principal_usage(by_principal) if self.exchange.per_principal_total else None
        report = self.meter.measure(
            now, bandwidth.granted_bytes, bandwidth.wait_seconds, admission.active, admission.waiting,
            by_principal, usage,
        )
        self.exchange.report = report
        self._release_unused(report)
        if self._lease is not None and self._renew_early(now, report):
            self._confirm_due = self._wanted = False
            self._lease.renew_soon()

    def wanted_back(self, payload: str) -> None:
        """WANTED_CHANNEL's notification (serving loop): when it names this slot, another slot
        waits for part of this one's share. Lower the buckets to the part named (never below
        the floor, never above what they have) and renew as soon as the gaps allow, so the
        rest frees at once. Lowering our own rate is always safe, whoever sent it."""
        if self._lease is None:
            return
        mine = f"{self._lease.slot}:"
        for item in payload.split(",")[:64]:
            if not item.startswith(mine):
                continue
            try:
                part = int(item[len(mine):])
            except ValueError:
                return
            exchange = self.exchange
            keep = max(exchange.effective(exchange.floor), part)
            if keep < exchange.applied.process:
                exchange.release(keep)
                self.apply()
            self._wanted = True
            now = self.clock()
            if self._renew_early(now, self.exchange.report):
                self._confirm_due = self._wanted = False
                self._lease.renew_soon()
            return

    def _release_unused(self, report: DemandReport) -> None:
        """The demand fell well below the rate in force: lower the buckets to what the database
        will grant for it (never below the floor) before telling it, so that the renewal the
        change sets off frees the rest at once (grants.py `release`)."""
        exchange = self.exchange
        keep = max(exchange.effective(exchange.floor), report.demand)
        if keep * MOVED < exchange.applied.process:
            exchange.release(keep)
            self.apply()

    def _renew_early(self, now: float, report: DemandReport) -> bool:
        exchange = self.exchange
        if exchange.in_flight or exchange.last_sent is None:
            return False
        since = now - exchange.last_sent
        if since < early_gap(exchange):
            return False
        if self._confirm_due or self._wanted:
            return True  # the database holds our old share until we confirm the new one
        last = exchange.last_report
        slack = exchange.floor
        if report.demand > last.demand * MOVED + slack or report.demand * MOVED + slack < last.demand:
            return True
        if report.principals.keys() != last.principals.keys():
            return True
        wants_more = report.demand > exchange.applied.process or bool(report.principals)
        return exchange.received.short and wants_more and since >= SHORT_RETRY_S

    # -- what readiness shows ------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        exchange = self.exchange
        grant, report, applied = exchange.received, exchange.last_report, exchange.applied
        return {
            "grantedBytesPerSecond": grant.process,
            "appliedBytesPerSecond": applied.process,
            "targetBytesPerSecond": grant.target,
            "demandBytesPerSecond": report.demand,
            "downloads": report.weight,
            "floorBytesPerSecond": exchange.floor,
            "principalFloorBytesPerSecond": exchange.principal_floor or None,
            "principalsWithShare": len(grant.principals),
            "redivisions": self.redivisions,
        }


def observe_shares(
    metrics: Metrics, total: int, demand: Callable[[], int], redivisions: Callable[[], int]
) -> None:
    """Export the reported demand, the total and the re-divisions, read at scrape time. Every
    process with a shared budget exports them from the start (static mode: demand and
    re-divisions stay 0), so an alert on them never waits for a first series."""
    metrics.registry.register(_ShareCollector(total, demand, redivisions))


class _ShareCollector(Collector):
    def __init__(self, total: int, demand: Callable[[], int], redivisions: Callable[[], int]) -> None:
        self.total, self.demand, self.redivisions = total, demand, redivisions

    def collect(self):
        demand = GaugeMetricFamily(
            "arkvory_download_demand_bytes_per_second",
            "Payload rate this process reported it could use at its last renewal (demand shares; 0 in static mode)",
        )
        demand.add_metric([], self.demand())
        yield demand
        total = GaugeMetricFamily(
            "arkvory_download_share_total_bytes_per_second",
            "The total payload rate of all processes together (the policy's)",
        )
        total.add_metric([], self.total)
        yield total
        redivisions = CounterMetricFamily(
            "arkvory_download_share_redivisions",
            "Grants that changed this process's share (of the total or of a principal's)",
        )
        redivisions.add_metric([], self.redivisions())
        yield redivisions
