"""Demand mode's serving side with a fake clock (issue 23): the buckets change rate in place
without ever adding credit, the scheduler takes a grant while transfers wait, and the meter turns
the counters into a demand."""

from __future__ import annotations

import asyncio

from arkvory.shared.cluster.grants import DemandReport, ShareExchange
from arkvory.shared.download.demand import DemandMeter
from arkvory.shared.download.throttle import BandwidthScheduler, TokenBucket, burst_for

from .fakeclock import FakeTime


def test_a_lowered_rate_keeps_no_more_than_the_burst_and_refills_at_the_old_rate_until_then():
    time = FakeTime()
    bucket = TokenBucket(1_000_000, 100_000, time.clock)
    assert bucket.try_take(100_000)
    time.advance(0.05)  # 50 000 bytes of refill at the old rate
    bucket.set_rate(10_000, time.ns)
    assert bucket.available() == 50_000  # kept: earned before the change, within the burst
    time.advance(1.0)
    assert bucket.available() == 60_000  # then at the new rate
    bucket.set_rate(5_000_000, time.ns)
    assert bucket.available() == 60_000  # a raise adds nothing at once
    time.advance(1.0)
    assert bucket.available() == 100_000  # never above the burst


def test_a_give_back_after_a_rate_change_returns_nothing():
    time = FakeTime()
    bucket = TokenBucket(1_000_000, 100_000, time.clock)
    taken_at = time.ns
    assert bucket.try_take(100_000)
    time.advance_ns(1)
    bucket.set_rate(2_000_000, time.ns)  # changed just after the take
    time.advance(0.01)
    bucket._give_back(100_000, taken_at, time.ns)
    assert bucket.available() == 20_000  # only the refill since the change


def test_the_scheduler_takes_a_grant_while_transfers_wait():
    async def main():
        time = FakeTime(auto=False)
        scheduler = BandwidthScheduler(1_000_000, 100_000, time.clock, time.sleep)
        quantum = scheduler.quantum_bytes
        for _ in range(20):  # empty both buckets of alice
            if not scheduler.grant_now("alice", quantum):
                break
        waiter = asyncio.ensure_future(scheduler.grant("alice", quantum))
        await asyncio.sleep(0)
        assert not waiter.done()
        scheduler.set_rates(1_000_000, {"alice": 100_000_000}, 1_000)
        assert scheduler.per_principal_bytes_per_second == 1_000
        for _ in range(50):
            time.advance(0.001)
            await asyncio.sleep(0)
            if waiter.done():
                break
        assert waiter.done() and waiter.result() == quantum
        # alice's bucket is kept while she has a grant; bob starts at the default rate
        assert scheduler.grant_now("bob", quantum) == quantum
        assert scheduler._principals["bob"].bucket.rate == 1_000
        assert scheduler._principals["alice"].bucket.burst == burst_for(100_000)  # bursts stay
        scheduler.close(RuntimeError("done"))

    asyncio.run(main())


def test_the_meter():
    exchange = ShareExchange(10_000_000, 0, 3, local_limit=8_000_000)
    meter = DemandMeter(exchange)
    assert meter.measure(0.0, 0, 0.0, 0, 0, {}).demand == 0  # idle: only the floor
    # downloads that started within the window: new here, the ceiling (the local limit here)
    assert meter.measure(0.5, 0, 0.0, 2, 0, {"a": 1, "b": 1}).demand == 8_000_000
    meter.measure(1.0, 0, 0.0, 2, 0, {"a": 1, "b": 1})
    # sending, never waiting for tokens: 1.25 × what it sent over the window
    report = meter.measure(2.0, 1_000_000, 0.0, 2, 0, {"a": 1, "b": 1})
    assert report.demand == 1_250_000 and report.weight == 2
    # waited for tokens 10 % of the time: the ceiling
    assert meter.measure(3.0, 2_000_000, 0.1, 2, 0, {"a": 2}).demand == 8_000_000
    # downloads waiting for a place: the ceiling too
    assert meter.measure(3.25, 2_000_000, 0.1, 2, 1, {"a": 3}).demand == 8_000_000
    # principals' totals bound the ceiling: two principals of 1 MB/s each
    with_principals = DemandMeter(ShareExchange(10_000_000, 1_000_000, 3))
    report = with_principals.measure(0.0, 0, 0.0, 3, 0, {"a": 2, "b": 1})
    assert report.demand == 2_000_000 and report.principals == {"a": (1_000_000, 2), "b": (1_000_000, 1)}


def test_the_share_mode_setting():
    from arkvory.shared.settings import Settings, SettingsError

    base = {"ARKVORY_DATABASE_URL": "postgresql://u@h/db", "ARKVORY_DATA_DIR": "/tmp/x"}
    shared = {**base, "ARKVORY_GATEWAY_SLOTS": "3", "ARKVORY_GATEWAY_SLOT": "0",
              "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND": str(3 * 2**20)}
    assert Settings.from_env(shared).shared.share_mode == "static"
    assert Settings.from_env({**shared, "ARKVORY_SHARE_MODE": "demand"}).shared.policy[3] == "demand"
    for env, says in (({**shared, "ARKVORY_SHARE_MODE": "fair"}, "ARKVORY_SHARE_MODE: expected one of static, demand"),
                      ({**base, "ARKVORY_SHARE_MODE": "demand"}, "ARKVORY_SHARE_MODE: expected static")):
        try:
            Settings.from_env(env)
        except SettingsError as exc:
            assert says in str(exc)
        else:
            raise AssertionError(env)


def test_each_principal_is_measured_like_the_process():
    """Per principal (with principals' totals): a new one, and one its own bucket holds back,
    ask for the total; one whose clients read slowly asks for 1.25 × what it was granted."""
    exchange = ShareExchange(30_000_000, 3_000_000, 3)
    meter = DemandMeter(exchange)
    downloads = {"new": 1, "bound": 2, "slow": 1}

    def tick(now, usage):
        return meter.measure(now, 0, 0.0, 4, 0, downloads, usage).principals

    assert tick(0.0, {}) == {"new": (3_000_000, 1), "bound": (3_000_000, 2), "slow": (3_000_000, 1)}
    for step in range(1, 5):
        usage = {"bound": (step * 1_000_000, True), "slow": (step * 100_000, False)}
        if step == 4:
            usage["bound"] = (step * 1_000_000, False)  # short at 3 of the window's 4 ticks
        got = tick(step * 0.25, usage)
    assert got["new"] == (3_000_000, 1)  # never seen by the buckets yet: as for a new download
    assert got["bound"] == (3_000_000, 2)
    # granted 0 (not tracked at the window's start) -> treated as new; one more window:
    for step in range(5, 10):
        got = tick(step * 0.25, {"slow": (step * 100_000, False), "bound": (step * 1_000_000, False)})
    assert got["slow"] == (500_000, 1)  # 400 000 B/s × 1.25
    assert got["bound"] == (3_000_000, 2)  # 4 MB/s, above its total: the total
    got = tick(2.5, {"slow": (1_000, False)})  # dropped and made again by the scheduler
    assert got["slow"] == (3_000_000, 1)


def test_the_scheduler_counts_each_principals_bytes_in_place_of_the_total():
    async def main():
        time = FakeTime()
        scheduler = BandwidthScheduler(10_000_000, 1_000_000, time.clock, time.sleep)
        for principal, size in (("a", 20_000), ("b", 20_000), ("a", 10_000)):
            assert scheduler.grant_now(principal, size) == size
        # bursts of 100 000, grants of 65 536: both could take one more at once
        assert scheduler.principal_usage(["a", "b", "c"]) == {"a": (30_000, False), "b": (20_000, False)}
        while scheduler.grant_now("b", scheduler.quantum_bytes):
            pass
        assert scheduler.principal_usage(["b"])["b"][1]  # short: its own bucket holds it back
        waited = await scheduler.grant("b", 10_000)  # through the dispatcher: counted too
        total = scheduler.granted_bytes
        assert total == 30_000 + scheduler.principal_usage(["b"])["b"][0] and waited == 10_000
        time.advance(5)  # both buckets full again: the next sweep drops them, the total stays
        scheduler.grant_now("c", 1)
        assert scheduler.tracked_principals == 1 and scheduler.granted_bytes == total + 1
        scheduler.close(RuntimeError("done"))

    asyncio.run(main())


def test_early_renewals_wait_longer_when_renewals_are_slow():
    """Early renewals of all slots keep the allocation's lock busy at most a quarter of the time:
    a process waits slots × its last renewal's database time × 4 between two (never less than 0.1 s)."""
    from prometheus_client import CollectorRegistry

    from arkvory.shared.download.admission import Admission
    from arkvory.shared.download.demand import DemandShares, early_gap
    from arkvory.shared.metrics import Metrics

    time = FakeTime()
    exchange = ShareExchange(16_000_000, 0, 16, clock=time.clock)
    assert early_gap(exchange) == 0.1
    exchange.last_took = 0.001
    assert early_gap(exchange) == 0.1  # 16 × 1 ms × 4 = 0.064 s
    exchange.last_took = 0.002
    assert early_gap(exchange) == 0.128
    exchange.last_took = 0.05
    assert early_gap(exchange) == 3.2

    class Lease:
        asked = 0

        def renew_soon(self):
            self.asked += 1

    lease = Lease()
    shares = DemandShares(
        exchange, BandwidthScheduler(1_000_000, None, time.clock, time.sleep),
        Admission(4, 4, 4, 1.0, clock=time.clock), Metrics(CollectorRegistry()), clock=time.clock,
    )
    shares._lease = lease
    exchange.last_sent = time.clock()
    exchange.report = exchange.last_report = DemandReport(0, 0, {})
    shares.meter.measure = lambda *args: DemandReport(16_000_000, 1, {})  # demand moved: renew early
    time.advance(1.0)
    shares.tick()
    assert lease.asked == 0  # 1 s < 3.2 s
    time.advance(2.5)
    shares.tick()
    assert lease.asked == 1
