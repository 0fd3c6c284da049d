"""The download admission queue of one process, on a fake clock (SPEC §4, §8)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from arkvory.shared.download.admission import Admission, AdmissionRejected

from .fakeclock import FakeTime, settle


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Download:
    """A download that holds its place until `finish()`; `state` says how far it got."""

    def __init__(self, admission: Admission, principal: str) -> None:
        self.state = "waiting"
        self.error: AdmissionRejected | None = None
        self._done = asyncio.Event()
        self.task = asyncio.create_task(self._run(admission, principal))

    async def _run(self, admission: Admission, principal: str) -> None:
        try:
            async with admission.admit(principal):
                self.state = "active"
                await self._done.wait()
        except AdmissionRejected as exc:
            self.state, self.error = "rejected", exc
            return
        self.state = "finished"

    def finish(self) -> None:
        self._done.set()


def make(fake: FakeTime, capacity: int = 2, per_principal: int = 2, waiting: int = 4) -> Admission:
    return Admission(capacity, per_principal, waiting, 20.0, clock=fake.clock, sleep=fake.sleep)


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_enters_while_places_are_free_then_waits_in_arrival_order() -> None:
    fake = FakeTime(auto=False)
    admission = make(fake)
    downloads = [Download(admission, principal) for principal in ("a", "b", "c", "d")]
    await settle()
    assert [d.state for d in downloads] == ["active", "active", "waiting", "waiting"]
    assert (admission.active, admission.waiting) == (2, 2)
    downloads[1].finish()
    await settle()
    assert [d.state for d in downloads] == ["active", "finished", "active", "waiting"]
    downloads[0].finish()
    await settle()
    assert downloads[3].state == "active"
    for download in downloads:
        download.finish()
    await settle()
    assert (admission.active, admission.waiting) == (0, 0)


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_a_principal_at_its_limit_waits_without_blocking_others() -> None:
    fake = FakeTime(auto=False)
    admission = make(fake, capacity=3, per_principal=1)
    a1 = Download(admission, "a")
    await settle()
    a2 = Download(admission, "a")  # A is at its own limit
    await settle()
    b1 = Download(admission, "b")  # arrives later, but B has room: it goes first
    await settle()
    assert (a1.state, a2.state, b1.state) == ("active", "waiting", "active")
    c1 = Download(admission, "c")
    await settle()
    assert c1.state == "active" and admission.active == 3
    # Full overall now. A waiter of a principal at its limit must not block one behind it.
    d1 = Download(admission, "d")
    await settle()
    assert (a2.state, d1.state) == ("waiting", "waiting")
    b1.finish()
    await settle()
    assert (a2.state, d1.state) == ("waiting", "active")
    a1.finish()
    await settle()
    assert a2.state == "active"
    for download in (a2, c1, d1):
        download.finish()
    await settle()
    assert admission.active == 0


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_a_full_waiting_list_rejects_at_once() -> None:
    fake = FakeTime(auto=False)
    admission = make(fake, capacity=1, per_principal=1, waiting=1)
    first, second = Download(admission, "a"), Download(admission, "b")
    await settle()
    with pytest.raises(AdmissionRejected) as caught:
        async with admission.admit("c"):
            pytest.fail("must not be admitted")
    rejected = caught.value
    assert rejected.reason == "full"
    assert rejected.code == "busy" and rejected.status == 503
    assert isinstance(rejected.retry_after, int) and rejected.retry_after >= 1
    assert (admission.rejected, admission.waiting, admission.active) == (1, 1, 1)
    first.finish()
    second.finish()
    await settle()
    assert second.state == "finished"


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_a_wait_times_out_after_the_timeout() -> None:
    fake = FakeTime(auto=False)
    admission = Admission(1, 1, 4, 20.0, clock=fake.clock, sleep=fake.sleep)
    holder = Download(admission, "a")
    await settle()
    early = Download(admission, "b")
    await settle()
    fake.advance(5)
    late = Download(admission, "c")
    await settle()
    fake.advance(14.9)
    await settle()
    assert (early.state, late.state) == ("waiting", "waiting")
    fake.advance(0.2)  # 20.1 s for the first waiter, 15.1 s for the second
    await settle()
    assert early.state == "rejected" and early.error is not None
    assert early.error.reason == "timed_out" and early.error.retry_after >= 1
    assert late.state == "waiting"
    fake.advance(5)
    await settle()
    assert late.state == "rejected"
    assert (admission.timed_out, admission.rejected, admission.waiting) == (2, 0, 0)
    holder.finish()
    await settle()
    assert admission.active == 0


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_drain_wakes_waiters_and_refuses_newcomers_but_keeps_the_active() -> None:
    fake = FakeTime(auto=False)
    admission = make(fake, capacity=1, per_principal=1)
    active = Download(admission, "a")
    await settle()
    waiters = [Download(admission, principal) for principal in ("b", "c")]
    await settle()
    admission.drain()
    admission.drain()  # idempotent
    await settle()
    assert [w.state for w in waiters] == ["rejected", "rejected"]
    assert all(w.error is not None and w.error.reason == "draining" for w in waiters)
    newcomer = Download(admission, "d")
    await settle()
    assert newcomer.state == "rejected" and newcomer.error is not None
    assert newcomer.error.reason == "draining"
    assert active.state == "active"
    assert (admission.rejected, admission.waiting, admission.active) == (3, 0, 1)
    active.finish()
    await settle()
    assert active.state == "finished" and admission.active == 0


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    fake = FakeTime(auto=False)
    admission = make(fake, capacity=1, per_principal=1)
    holder = Download(admission, "a")
    await settle()
    gone, staying = Download(admission, "b"), Download(admission, "c")
    await settle()
    gone.task.cancel()
    await settle()
    assert gone.task.cancelled()
    assert (admission.cancelled, admission.waiting) == (1, 1)
    holder.finish()
    await settle()
    assert staying.state == "active"
    staying.finish()
    await settle()
    assert admission.active == 0


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_a_waiter_cancelled_just_after_admission_hands_its_place_on() -> None:
    fake = FakeTime(auto=False)
    admission = make(fake, capacity=1, per_principal=1)
    holder = Download(admission, "a")
    await settle()
    gone, staying = Download(admission, "b"), Download(admission, "c")
    await settle()
    holder.finish()
    await asyncio.sleep(0)  # holder leaves and admits `gone`, which has not resumed yet
    assert gone.state == "waiting" and admission.active == 1
    gone.task.cancel()
    await settle()
    assert gone.task.cancelled() and gone.state == "waiting"
    assert staying.state == "active"
    assert (admission.cancelled, admission.active, admission.waiting) == (1, 1, 0)
    staying.finish()
    await settle()
    assert admission.active == 0


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_an_error_inside_the_body_frees_the_place() -> None:
    fake = FakeTime(auto=False)
    admission = make(fake, capacity=1, per_principal=1)
    with contextlib.suppress(OSError):
        async with admission.admit("a"):
            assert admission.active == 1
            raise OSError("client reset")
    assert admission.active == 0
    async with admission.admit("a"):
        assert admission.active == 1


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_snapshot_has_exactly_the_ready_keys() -> None:
    fake = FakeTime(auto=False)
    admission = Admission(16, 4, 64, 20.0, clock=fake.clock, sleep=fake.sleep)
    async with admission.admit("a"):
        assert admission.snapshot() == {
            "active": 1,
            "waiting": 0,
            "capacity": 16,
            "perPrincipalCapacity": 4,
            "waitingCapacity": 64,
            "timeoutMs": 20_000,
            "rejected": 0,
            "timedOut": 0,
            "cancelled": 0,
        }


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_wait_idle_returns_true_when_the_last_leaves_and_false_on_timeout() -> None:
    fake = FakeTime(auto=False)
    admission = make(fake)
    assert await admission.wait_idle(5) is True  # nothing active
    download = Download(admission, "a")
    await settle()
    idle = asyncio.create_task(admission.wait_idle(5))
    await settle()
    assert not idle.done()
    download.finish()
    await settle()
    assert idle.result() is True

    stuck = Download(admission, "b")
    await settle()
    idle = asyncio.create_task(admission.wait_idle(5))
    await settle()
    fake.advance(5)
    await settle()
    assert idle.result() is False
    stuck.finish()
    await settle()


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_default_clock_times_out_for_real() -> None:
    admission = Admission(1, 1, 1, 0.05)
    async with admission.admit("a"):
        with pytest.raises(AdmissionRejected) as caught:
            async with admission.admit("b"):
                pytest.fail("must not be admitted")
    assert caught.value.reason == "timed_out" and admission.timed_out == 1


@pytest.mark.timeout(30)
def test_invalid_arguments_name_the_parameter() -> None:
    with pytest.raises(ValueError, match="capacity"):
        Admission(0, 1, 1, 1.0)
    with pytest.raises(ValueError, match="per_principal_capacity"):
        Admission(2, 3, 1, 1.0)
    with pytest.raises(ValueError, match="waiting_capacity"):
        Admission(2, 1, -1, 1.0)
    with pytest.raises(ValueError, match="timeout_s"):
        Admission(2, 1, 1, 0)
    with pytest.raises(ValueError, match="reason"):
        AdmissionRejected("nope")
    assert AdmissionRejected("draining").retry_after >= 1
