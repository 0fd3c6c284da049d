"""Token buckets and the bandwidth scheduler, on a fake clock (SPEC §4)."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from arkvory.shared.download.throttle import (
    MAX_BURST_BYTES,
    MAX_QUANTUM_BYTES,
    MIN_QUANTUM_BYTES,
    BandwidthScheduler,
    TokenBucket,
    burst_for,
)

from .fakeclock import NS, FakeTime, settle


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def assert_ceiling(events: list[tuple[int, int]], rate: int, burst: int) -> None:
    """For every interval [t_i, t_j] between two grants: bytes ≤ rate × elapsed + burst, exactly
    (in byte-nanoseconds). The worst interval of any kind starts and ends at a grant."""
    events = sorted(events)
    # bytes granted in [t_i, t_j] = S_j - S_{i-1}; need S_j*NS - rate*t_j ≤ S_{i-1}*NS - rate*t_i + burst*NS
    prefix = [0]
    for _, size in events:
        prefix.append(prefix[-1] + size)
    best_tail = None  # max over j ≥ i of S_j*NS - rate*t_j, built from the end
    worst = None
    for i in range(len(events) - 1, -1, -1):
        t_i = events[i][0]
        tail = prefix[i + 1] * NS - rate * t_i
        best_tail = tail if best_tail is None else max(best_tail, tail)
        excess = best_tail - (prefix[i] * NS - rate * t_i) - burst * NS
        worst = excess if worst is None else max(worst, excess)
    assert worst is not None and worst <= 0, f"ceiling exceeded by {worst / NS} bytes"


# -- burst and the bucket -----------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_burst_is_a_tenth_of_the_rate_capped_at_one_mebibyte() -> None:
    # SPEC §4's numbers, written out (a test that read MAX_BURST_BYTES would follow a change of it).
    assert burst_for(1) == 1
    assert burst_for(15) == 1
    assert burst_for(65_536) == 6_553
    assert burst_for(10_485_759) == 1_048_575
    assert burst_for(10_485_760) == 1_048_576
    assert burst_for(2**40) == 1_048_576
    with pytest.raises(ValueError, match="rate"):
        burst_for(0)


@pytest.mark.timeout(30)
def test_bucket_starts_full_and_refills_at_its_rate_up_to_the_burst() -> None:
    fake = FakeTime()
    bucket = TokenBucket(1_000, 100, fake.clock)
    assert bucket.available() == 100
    assert bucket.try_take(100)
    assert not bucket.try_take(1)
    assert bucket.delay(100) == pytest.approx(0.1)
    fake.advance(0.05)
    assert bucket.available() == 50
    fake.advance(10)
    assert bucket.available() == 100
    with pytest.raises(ValueError, match="size"):
        bucket.try_take(101)


@pytest.mark.timeout(30)
def test_invalid_arguments_name_the_parameter() -> None:
    with pytest.raises(ValueError, match="burst"):
        TokenBucket(10, 0, time.monotonic)
    with pytest.raises(ValueError, match="process_rate"):
        BandwidthScheduler(0, None)
    with pytest.raises(ValueError, match="per_principal_rate"):
        BandwidthScheduler(None, -5)


# -- the scheduler ------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_unlimited_mode_grants_at_once_and_only_counts() -> None:
    fake = FakeTime()
    scheduler = BandwidthScheduler(None, None, clock=fake.clock, sleep=fake.sleep)
    assert await scheduler.grant("a", 10 * MAX_BURST_BYTES) == 10 * MAX_BURST_BYTES
    assert await scheduler.grant("b", 1_000) == 1_000
    assert scheduler.granted_bytes == 10 * MAX_BURST_BYTES + 1_000
    assert scheduler.tracked_principals == 0
    assert scheduler.wait_seconds == 0
    assert fake.sleeps == []
    assert scheduler.bytes_per_second is None
    assert scheduler.per_principal_bytes_per_second is None
    assert scheduler.burst_bytes is None
    with pytest.raises(ValueError, match="want"):
        await scheduler.grant("a", 0)


@pytest.mark.anyio
@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("process_rate", "principal_rate", "quantum"),
    [
        (100 * MAX_BURST_BYTES, None, MAX_QUANTUM_BYTES),  # 10 ms = 1 MiB, also the burst
        (1000 * MAX_BURST_BYTES, None, MAX_QUANTUM_BYTES),  # 10 ms = 10 MiB: capped at 1 MiB
        (100_000, None, 10_000),  # burst 10 000 < 64 KiB
        (1_000_000, None, MIN_QUANTUM_BYTES),  # 10 ms = 10 000: raised to 64 KiB (burst 100 000)
        (100 * MAX_BURST_BYTES, 200_000, 20_000),  # the principal's burst is the smaller one
        (None, 50 * MAX_BURST_BYTES, 50 * MAX_BURST_BYTES // 100),  # 10 ms of the principal's rate
        (100 * MAX_BURST_BYTES, 20 * MAX_BURST_BYTES, 20 * MAX_BURST_BYTES // 100),  # the smaller rate
    ],
)
async def test_quanta_are_10_ms_of_the_smaller_rate_within_bounds_and_bursts(
    process_rate: int | None, principal_rate: int | None, quantum: int
) -> None:
    fake = FakeTime()
    scheduler = BandwidthScheduler(process_rate, principal_rate, clock=fake.clock, sleep=fake.sleep)
    assert scheduler.quantum_bytes == quantum
    sizes = []

    async def transfer(principal: str) -> None:
        for _ in range(30):
            sizes.append(await scheduler.grant(principal, 10 * MAX_BURST_BYTES))

    async with asyncio.TaskGroup() as tg:
        for principal in ("a", "a", "b"):
            tg.create_task(transfer(principal))
    assert set(sizes) == {quantum}
    assert quantum <= MAX_QUANTUM_BYTES
    for rate in (process_rate, principal_rate):
        if rate is not None:
            assert quantum <= burst_for(rate)
    assert await scheduler.grant("c", 7) == 7  # a small want is served as asked


@pytest.mark.anyio
@pytest.mark.timeout(30)
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_ceiling_holds_for_every_interval(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random transfers, sizes and pauses: no interval ever exceeds rate × elapsed + burst, for the
    process bucket and for each principal's bucket.

    Bytes count at the instant they are taken from a bucket (the grant); a woken caller may resume
    later than that, so the takes are recorded at the bucket rather than where `grant` returns.
    """
    takes: dict[TokenBucket, list[tuple[int, int]]] = {}
    take = TokenBucket._take

    def recording_take(bucket: TokenBucket, size: int) -> None:
        takes.setdefault(bucket, []).append((bucket._stamp, size))  # refilled to `now` just before
        take(bucket, size)

    monkeypatch.setattr(TokenBucket, "_take", recording_take)
    rng = random.Random(seed)
    fake = FakeTime()
    process_rate, principal_rate = 3_000_000, 1_200_000
    scheduler = BandwidthScheduler(process_rate, principal_rate, clock=fake.clock, sleep=fake.sleep)
    returned: list[tuple[int, int]] = []

    async def transfer(principal: str, grants: int) -> None:
        for _ in range(grants):
            if rng.random() < 0.3:
                fake.advance(rng.uniform(0, 0.08))  # the client is slow to read
            await asyncio.sleep(0)
            size = await scheduler.grant(principal, rng.randint(1, 200_000))
            assert 1 <= size <= scheduler.quantum_bytes
            returned.append((fake.ns, size))

    async with asyncio.TaskGroup() as tg:
        for principal, transfers in (("a", 6), ("b", 2), ("c", 1), ("d", 1)):
            for _ in range(transfers):
                tg.create_task(transfer(principal, rng.randint(20, 120)))

    process_buckets = [bucket for bucket in takes if bucket.rate == process_rate]
    assert len(process_buckets) == 1 and len(takes) >= 5  # the process and four principals
    assert sum(size for _, size in takes[process_buckets[0]]) == scheduler.granted_bytes
    assert sum(size for _, size in returned) == scheduler.granted_bytes
    for bucket, events in takes.items():
        assert_ceiling(events, bucket.rate, burst_for(bucket.rate))
    # The limit is also reached, not only respected: over the whole run the process rate was
    # the bottleneck most of the time.
    first, last = min(returned)[0], max(returned)[0]
    assert scheduler.granted_bytes >= 0.5 * process_rate * (last - first) / NS


@pytest.mark.timeout(30)
def test_ceiling_holds_for_direct_grants_at_random_instants() -> None:
    """One caller, no waiting: only the fast path, at random instants and sizes."""
    rng = random.Random(7)
    fake = FakeTime()
    rate = 1_000_000
    bucket = TokenBucket(rate, burst_for(rate), fake.clock)
    events = []
    for _ in range(5_000):
        fake.advance_ns(rng.randint(0, 3_000_000))
        size = rng.randint(1, burst_for(rate))
        if bucket.try_take(size):
            events.append((fake.ns, size))
    assert len(events) > 500
    assert_ceiling(events, rate, burst_for(rate))


@pytest.mark.timeout(30)
def test_grants_gathered_for_one_send_are_quanta_that_each_passed_the_buckets() -> None:
    """`grant_now_up_to` (a zero-copy send's several grants in one system call, issue 26):
    at one instant no more than the burst; as time passes, quantum after quantum, never more
    than `want`; and the ceiling holds for every interval, as for single grants."""
    rng = random.Random(26)
    fake = FakeTime()
    rate = 200 * MAX_QUANTUM_BYTES  # 200 quanta a second: a quantum refills in 5 ms
    scheduler = BandwidthScheduler(rate, None, clock=fake.clock, sleep=fake.sleep)
    assert scheduler.grant_now_up_to("p", 4 * MAX_QUANTUM_BYTES) == MAX_BURST_BYTES  # a full bucket, once
    assert scheduler.grant_now_up_to("p", 4 * MAX_QUANTUM_BYTES) == 0  # nothing refilled yet
    assert scheduler.grant_now_up_to("p", 0) == 0
    events = []
    stepping = fake.clock

    def clock() -> float:  # each reading a little later: refills between the quanta of one call
        fake.advance_ns(rng.randint(0, 8_000_000))
        return stepping()

    class Recorded(BandwidthScheduler):
        def grant_now(self, principal_id: str, want: int) -> int:
            size = super().grant_now(principal_id, want)
            if size:
                events.append((fake.ns, size))  # the instant of its clock reading
            return size

    scheduler = Recorded(rate, None, clock=clock, sleep=fake.sleep)
    gathered = []
    for _ in range(2_000):
        before = scheduler.granted_bytes
        want = rng.randint(1, 6 * MAX_QUANTUM_BYTES)
        size = scheduler.grant_now_up_to("p", want)
        assert 0 <= size <= want and scheduler.granted_bytes - before == size
        gathered.append(size)
    assert max(gathered) > MAX_BURST_BYTES  # several quanta in one call
    assert max(size for _, size in events) <= MAX_QUANTUM_BYTES
    assert_ceiling(events, rate, burst_for(rate))


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_round_robin_serves_principals_not_transfers() -> None:
    """A has ten transfers waiting, B one: B still gets about half of the grants."""
    fake = FakeTime()
    scheduler = BandwidthScheduler(1_000_000, None, clock=fake.clock, sleep=fake.sleep)
    grants = {"a": 0, "b": 0}
    stop = asyncio.Event()

    async def transfer(principal: str) -> None:
        while not stop.is_set():
            await scheduler.grant(principal, MIN_QUANTUM_BYTES)
            grants[principal] += 1
            if grants["a"] + grants["b"] >= 600:
                stop.set()

    async with asyncio.TaskGroup() as tg:
        for _ in range(10):
            tg.create_task(transfer("a"))
        tg.create_task(transfer("b"))
    share_b = grants["b"] / (grants["a"] + grants["b"])
    assert 0.45 <= share_b <= 0.55, grants


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_no_transfer_of_a_principal_starves() -> None:
    fake = FakeTime()
    scheduler = BandwidthScheduler(1_000_000, None, clock=fake.clock, sleep=fake.sleep)
    counts = [0] * 8
    stop = asyncio.Event()

    async def transfer(index: int) -> None:
        while not stop.is_set():
            await scheduler.grant("a", MIN_QUANTUM_BYTES)
            counts[index] += 1
            if sum(counts) >= 800:
                stop.set()

    async with asyncio.TaskGroup() as tg:
        for index in range(len(counts)):
            tg.create_task(transfer(index))
    assert min(counts) >= 0.8 * max(counts), counts


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_principal_bucket_limits_one_principal_and_not_another() -> None:
    fake = FakeTime()
    principal_rate = 500_000
    scheduler = BandwidthScheduler(10_000_000, principal_rate, clock=fake.clock, sleep=fake.sleep)
    quantum = scheduler.quantum_bytes  # 50 000: the principal's burst
    granted = {"a": 0, "b": 0}
    stop = asyncio.Event()

    async def transfer(principal: str) -> None:
        while not stop.is_set():
            size = await scheduler.grant(principal, quantum)
            granted[principal] += size
            await asyncio.sleep(0)

    start = fake.ns
    async with asyncio.TaskGroup() as tg:
        for _ in range(5):
            tg.create_task(transfer("a"))
        tg.create_task(transfer("b"))
        while fake.ns - start < 4 * NS:
            await asyncio.sleep(0)
        stop.set()
    elapsed = (fake.ns - start) / NS
    ceiling = principal_rate * elapsed + burst_for(principal_rate) + 5 * quantum
    # A's five transfers share one principal bucket; B's one transfer gets the same rate.
    assert 0.9 * principal_rate * elapsed <= granted["a"] <= ceiling
    assert 0.9 * principal_rate * elapsed <= granted["b"] <= ceiling


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_a_principal_at_its_limit_does_not_delay_another() -> None:
    fake = FakeTime(auto=False)
    scheduler = BandwidthScheduler(10_000_000, 100_000, clock=fake.clock, sleep=fake.sleep)
    assert await scheduler.grant("a", 10_000) == 10_000  # A's bucket is now empty
    waiting_a = asyncio.create_task(scheduler.grant("a", 10_000))
    await settle()
    assert not waiting_a.done() and scheduler.waiting == 1
    # B has a full bucket and the process bucket has room: no waiting, no clock movement.
    assert await scheduler.grant("b", 10_000) == 10_000
    assert fake.ns == 1_000 * NS
    fake.advance(0.1)
    await settle()
    assert waiting_a.result() == 10_000


@pytest.mark.anyio
@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("process_rate", "principal_rate", "later"),
    [
        (None, 100_000, "a"),  # A's own bucket: its principal's queue decides
        (100_000, None, "b"),  # the process bucket: the ring decides
        (100_000, 1_000_000, "b"),  # both buckets: the ring still decides
    ],
)
async def test_a_later_smaller_request_does_not_overtake_a_waiter(
    process_rate: int | None, principal_rate: int | None, later: str
) -> None:
    """A waits for 10 000 bytes; 5 000 are back when a request for 3 000 arrives: it is not
    served before A, neither at once (`grant_now`) nor by the dispatcher, so a stream of small
    requests never starves a big one."""
    fake = FakeTime(auto=False)
    scheduler = BandwidthScheduler(process_rate, principal_rate, clock=fake.clock, sleep=fake.sleep)
    await scheduler.grant("a", 10_000)  # the bucket that decides is empty
    big = asyncio.create_task(scheduler.grant("a", 10_000))
    await settle()
    fake.advance(0.05)  # 5 000 bytes back: enough for the small one, not for the big one
    assert scheduler.grant_now(later, 3_000) == 0
    small = asyncio.create_task(scheduler.grant(later, 3_000))
    await settle()
    assert not small.done() and not big.done()
    fake.advance(0.05)
    await settle()
    assert big.result() == 10_000 and not small.done()
    fake.advance(0.03)
    await settle()
    assert small.result() == 3_000


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_dispatcher_sleeps_exactly_until_the_deficit_is_refilled() -> None:
    fake = FakeTime()
    scheduler = BandwidthScheduler(1_000_000, None, clock=fake.clock, sleep=fake.sleep)
    assert scheduler.burst_bytes == 100_000
    assert await scheduler.grant("a", MIN_QUANTUM_BYTES) == MIN_QUANTUM_BYTES  # 34 464 left
    assert await scheduler.grant("a", MIN_QUANTUM_BYTES) == MIN_QUANTUM_BYTES  # waits for 31 072 bytes
    assert fake.sleeps == [pytest.approx(0.031072, abs=1e-9)]
    assert scheduler.wait_seconds == pytest.approx(0.031072, abs=1e-9)
    await settle()
    # The dispatcher is gone once nobody waits.
    assert {task.get_name() for task in asyncio.all_tasks()}.isdisjoint(
        {"arkvory-bandwidth-dispatcher"}
    )


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_a_waiter_ready_sooner_wakes_the_sleeping_dispatcher() -> None:
    fake = FakeTime(auto=False)
    scheduler = BandwidthScheduler(10_000_000, 100_000, clock=fake.clock, sleep=fake.sleep)
    await scheduler.grant("a", 10_000)
    waiting_a = asyncio.create_task(scheduler.grant("a", 10_000))  # ready in 100 ms
    await settle()
    assert fake.sleeps == [pytest.approx(0.1)]
    await scheduler.grant("b", 1_000)
    waiting_b = asyncio.create_task(scheduler.grant("b", 10_000))  # 1 000 short: ready in 10 ms
    await settle()
    assert fake.sleeps == [pytest.approx(0.1), pytest.approx(0.01)]
    fake.advance(0.01)
    await settle()
    assert waiting_b.done() and not waiting_a.done()
    fake.advance(0.09)
    await settle()
    assert waiting_a.result() == 10_000


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_close_fails_current_waiters_and_every_later_grant() -> None:
    class LeaseLost(Exception):
        pass

    fake = FakeTime(auto=False)
    scheduler = BandwidthScheduler(100_000, 50_000, clock=fake.clock, sleep=fake.sleep)
    await scheduler.grant("a", 5_000)
    waiters = [asyncio.create_task(scheduler.grant(p, 5_000)) for p in ("a", "a", "b")]
    await settle()
    assert scheduler.waiting >= 2
    reason = LeaseLost("slot 1 lost")
    scheduler.close(reason)
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(result is reason for result in results if not isinstance(result, int))
    assert any(result is reason for result in results)
    assert scheduler.waiting == 0 and scheduler.closed
    with pytest.raises(LeaseLost):
        await scheduler.grant("c", 1)
    unlimited = BandwidthScheduler(None, None)
    unlimited.close(reason)
    with pytest.raises(LeaseLost):
        await unlimited.grant("a", 1)
    await settle()
    assert {task.get_name() for task in asyncio.all_tasks()}.isdisjoint(
        {"arkvory-bandwidth-dispatcher"}
    )


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_a_cancelled_waiter_leaves_the_queue_without_losing_tokens() -> None:
    fake = FakeTime(auto=False)
    scheduler = BandwidthScheduler(100_000, None, clock=fake.clock, sleep=fake.sleep)
    assert await scheduler.grant("a", 10_000) == 10_000  # the process bucket is empty
    gone = asyncio.create_task(scheduler.grant("a", 10_000))
    await settle()
    assert scheduler.waiting == 1
    gone.cancel()
    await settle()
    assert gone.cancelled() and scheduler.waiting == 0
    staying = asyncio.create_task(scheduler.grant("b", 10_000))
    await settle()
    fake.advance(0.1)  # exactly one burst refilled: all of it goes to the remaining waiter
    await settle()
    assert staying.result() == 10_000
    assert scheduler.granted_bytes == 20_000


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_tokens_granted_to_a_waiter_cancelled_before_it_resumed_come_back() -> None:
    fake = FakeTime(auto=False)
    scheduler = BandwidthScheduler(100_000, 100_000, clock=fake.clock, sleep=fake.sleep)
    await scheduler.grant("a", 10_000)
    gone = asyncio.create_task(scheduler.grant("a", 10_000))
    await settle()
    fake.advance(0.1)  # the dispatcher wakes and grants...
    await asyncio.sleep(0)  # ...runs before us, and `gone` has not resumed yet
    gone.cancel()
    await settle()
    assert gone.cancelled()
    assert scheduler.granted_bytes == 10_000
    # Both buckets hold their burst again: A is served at once, without the clock moving.
    again = asyncio.create_task(scheduler.grant("a", 10_000))
    await settle()
    assert again.done() and again.result() == 10_000
    assert scheduler.granted_bytes == 20_000


async def _cancel_a_grant_after(scheduler: BandwidthScheduler, fake: FakeTime, out_for: float, taken: int) -> None:
    """A waiter of principal "a" is granted a burst (the bucket is empty again) and, before it
    resumes, `out_for` seconds pass, `taken` bytes are granted to another transfer of "a", and
    the waiter is cancelled: its tokens go back."""
    assert await scheduler.grant("a", 10_000) == 10_000  # the bucket is empty
    waiter = asyncio.create_task(scheduler.grant("a", 10_000))
    await settle()
    fake.advance(0.1)  # the dispatcher wakes and takes a burst for it...
    await asyncio.sleep(0)  # ...and runs before the waiter resumes
    assert scheduler.grant_now("a", 1) == 0 and not waiter.done()
    fake.advance(out_for)
    assert scheduler.grant_now("a", taken) == taken
    waiter.cancel()
    await settle()
    assert waiter.cancelled()


@pytest.mark.anyio
@pytest.mark.timeout(30)
@pytest.mark.parametrize(("process_rate", "principal_rate"), [(100_000, None), (None, 100_000)])
async def test_a_cancelled_grant_gives_back_only_what_the_bucket_could_still_hold(
    process_rate: int | None, principal_rate: int | None
) -> None:
    """Tokens that come back after a while must not beat the ceiling: while they were out, the
    bucket refilled and threw away what did not fit. It ends no fuller than if the grant had
    never been made (mutation (b) of issue 22 §15 gave all of them back). Burst 10 000 here,
    for the process bucket and for a principal's."""
    fake = FakeTime(auto=False)
    scheduler = BandwidthScheduler(process_rate, principal_rate, clock=fake.clock, sleep=fake.sleep)

    # The bucket refilled to its burst while the tokens were out, and that burst was taken:
    # none of them come back (20 000 bytes at one instant would pass one burst).
    await _cancel_a_grant_after(scheduler, fake, 0.5, taken=10_000)
    assert scheduler.grant_now("a", 1) == 0

    # Half of a burst refilled meanwhile and was taken: the other half comes back.
    fake.advance(0.1)
    await _cancel_a_grant_after(scheduler, fake, 0.05, taken=5_000)
    assert scheduler.grant_now("a", 5_001) == 0
    assert scheduler.grant_now("a", 5_000) == 5_000
    assert scheduler.grant_now("a", 1) == 0


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("rate", "burst"), [(100_000, 10_000), (5_000_000, 500_000), (50 * 1_048_576, 1_048_576)]
)
@pytest.mark.parametrize("bucket", ["process", "principal"])
def test_a_full_bucket_hands_out_exactly_one_burst_at_once(rate: int, burst: int, bucket: str) -> None:
    fake = FakeTime()
    rates = (rate, None) if bucket == "process" else (None, rate)
    scheduler = BandwidthScheduler(*rates, clock=fake.clock, sleep=fake.sleep)
    left = burst
    while left:
        want = min(left, scheduler.quantum_bytes)
        assert scheduler.grant_now("a", want) == want
        left -= want
    assert scheduler.grant_now("a", 1) == 0


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_principals_take_turns_one_grant_each() -> None:
    """A queued three transfers before B and C queued one each: the grants go A, B, C, A, A
    (round-robin over principals, one grant per turn), not in the order they queued."""
    fake = FakeTime(auto=False)
    scheduler = BandwidthScheduler(100_000, None, clock=fake.clock, sleep=fake.sleep)
    assert await scheduler.grant("z", 10_000) == 10_000  # the process bucket is empty
    order: list[str] = []

    async def transfer(name: str) -> None:
        await scheduler.grant(name[0], 10_000)
        order.append(name)

    tasks = []
    for name in ("a1", "a2", "a3", "b1", "c1"):
        tasks.append(asyncio.create_task(transfer(name)))
        await settle()
    for _ in tasks:
        fake.advance(0.1)  # one burst: one grant
        await settle()
    assert order == ["a1", "b1", "c1", "a2", "a3"]
    await asyncio.gather(*tasks)


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_idle_principal_buckets_are_dropped_once_full() -> None:
    fake = FakeTime()
    scheduler = BandwidthScheduler(None, 1_000_000, clock=fake.clock, sleep=fake.sleep)
    for index in range(50):
        await scheduler.grant(f"p{index}", 1_000)
    assert scheduler.tracked_principals == 50
    fake.advance(2)  # every bucket has refilled
    await scheduler.grant("last", 1_000)
    assert scheduler.tracked_principals == 1


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_real_clock_and_sleep() -> None:
    """The defaults (time.monotonic, asyncio.sleep) with a short real run."""
    rate = 2_000_000
    scheduler = BandwidthScheduler(rate, 1_500_000)
    stop = asyncio.Event()

    async def transfer(principal: str) -> None:
        while not stop.is_set():
            await scheduler.grant(principal, MIN_QUANTUM_BYTES)

    start = time.monotonic()
    async with asyncio.TaskGroup() as tg:
        for principal in ("a", "a", "a", "b"):
            tg.create_task(transfer(principal))
        await asyncio.sleep(0.3)
        stop.set()
    elapsed = time.monotonic() - start
    granted = scheduler.granted_bytes
    assert granted <= rate * elapsed + burst_for(rate) + 4 * MIN_QUANTUM_BYTES
    assert granted >= 0.7 * rate * 0.3
