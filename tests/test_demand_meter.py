"""Demand mode's serving side with a fake clock (issue 23): the buckets change rate in place
without ever adding credit, the scheduler takes a grant while transfers wait, and the meter turns
the counters into a demand."""

from __future__ import annotations

import asyncio

from arkvory.shared.cluster.grants import ShareExchange
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
    # sending, never waiting for tokens: 1.25 × what it sent
    report = meter.measure(1.0, 1_000_000, 0.0, 2, 0, {"a": 1, "b": 1})
    assert report.demand == 1_250_000 and report.weight == 2
    # waited for tokens 10 % of the time: the ceiling (the local limit here)
    assert meter.measure(2.0, 2_000_000, 0.1, 2, 0, {"a": 2}).demand == 8_000_000
    # downloads waiting for a place: the ceiling too
    assert meter.measure(2.25, 2_000_000, 0.1, 2, 1, {"a": 3}).demand == 8_000_000
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
