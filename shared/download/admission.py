"""Admission of downloads in one process (SPEC §4): how many may send payload at once, overall
and per principal, and a bounded, timed FIFO for the rest.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

RETRY_AFTER_BUSY_S = 1
RETRY_AFTER_DRAINING_S = 2  # same hint as /health/status gives while draining

_REASONS = ("full", "timed_out", "draining")


class AdmissionRejected(Exception):
    """A download was not admitted; the HTTP edge answers 503 `busy` with `Retry-After`."""

    code = "busy"
    status = 503

    def __init__(self, reason: str, retry_after: int | None = None) -> None:
        if reason not in _REASONS:
            raise ValueError(f"reason must be one of {', '.join(_REASONS)}, got {reason!r}")
        if retry_after is None:
            retry_after = RETRY_AFTER_DRAINING_S if reason == "draining" else RETRY_AFTER_BUSY_S
        if isinstance(retry_after, bool) or not isinstance(retry_after, int) or retry_after < 1:
            raise ValueError(f"retry_after must be a whole number of seconds ≥ 1, got {retry_after!r}")
        super().__init__(f"download not admitted: {reason.replace('_', ' ')}")
        self.reason = reason
        self.retry_after = retry_after


class _Waiter:
    __slots__ = ("principal_id", "future", "deadline")

    def __init__(self, principal_id: str, future: asyncio.Future[None], deadline: float) -> None:
        self.principal_id = principal_id
        self.future = future
        self.deadline = deadline


class Admission:
    """Places for downloads in this process.

    Waiters are admitted in arrival order, except that a waiter whose principal is at its own limit
    is passed over (not blocking anyone behind it). Every waiter has the same timeout, so arrival
    order is also deadline order and one expiry task, sleeping until the oldest deadline, is enough.
    """

    def __init__(
        self,
        capacity: int,
        per_principal_capacity: int,
        waiting_capacity: int,
        timeout_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        _check_count("capacity", capacity, 1)
        _check_count("per_principal_capacity", per_principal_capacity, 1)
        if per_principal_capacity > capacity:
            raise ValueError(
                f"per_principal_capacity must not exceed capacity ({capacity}), "
                f"got {per_principal_capacity!r}"
            )
        _check_count("waiting_capacity", waiting_capacity, 0)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (
            0 < timeout_s < math.inf
        ):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self._capacity = capacity
        self._per_principal_capacity = per_principal_capacity
        self._waiting_capacity = waiting_capacity
        self._timeout_s = float(timeout_s)
        self._clock = clock
        self._sleep = sleep

        self._active = 0
        self._active_by_principal: dict[str, int] = {}
        self._waiters: dict[_Waiter, None] = {}  # insertion order = arrival order = deadline order
        self._expiry: asyncio.Task[None] | None = None
        self._idle: list[asyncio.Future[None]] = []
        self._draining = False

        self._rejected = 0
        self._timed_out = 0
        self._cancelled = 0

    # -- counters ----------------------------------------------------------------------------

    @property
    def active(self) -> int:
        return self._active

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def rejected(self) -> int:
        """Refused at once: waiting list full, or draining (including waiters woken by drain)."""
        return self._rejected

    @property
    def timed_out(self) -> int:
        return self._timed_out

    @property
    def cancelled(self) -> int:
        return self._cancelled

    @property
    def draining(self) -> bool:
        return self._draining

    def by_principal(self) -> dict[str, int]:
        """Downloads per principal, sending or waiting for a place (demand mode reads this a few
        times a second, never per request)."""
        counts = dict(self._active_by_principal)
        for waiter in self._waiters:
            counts[waiter.principal_id] = counts.get(waiter.principal_id, 0) + 1
        return counts

    def snapshot(self) -> dict[str, Any]:
        """The `admission` object of /health/ready."""
        return {
            "active": self._active,
            "waiting": len(self._waiters),
            "capacity": self._capacity,
            "perPrincipalCapacity": self._per_principal_capacity,
            "waitingCapacity": self._waiting_capacity,
            "timeoutMs": round(self._timeout_s * 1000),
            "rejected": self._rejected,
            "timedOut": self._timed_out,
            "cancelled": self._cancelled,
        }

    # -- entering and leaving --------------------------------------------------------------

    def admit(self, principal_id: str) -> _Place:
        """`async with admission.admit(principal_id):` holds one place while the body runs."""
        return _Place(self, principal_id)

    def try_enter(self, principal_id: str) -> bool:
        """Take a place now if one is free: True, and `leave` gives it back; False when the
        caller has to wait for one (`enter`). AdmissionRejected while draining. The hot path's
        form of `admit` (a download of a small artifact takes no coroutine for its place)."""
        if self._draining:
            self._rejected += 1
            raise AdmissionRejected("draining")
        held = self._active_by_principal.get(principal_id, 0)
        # No waiter can be eligible at this point (every change re-admits), so entering directly
        # never overtakes anyone who could have gone first.
        if self._active < self._capacity and held < self._per_principal_capacity:
            self._active += 1  # as _occupy, without the call (this runs on every download)
            self._active_by_principal[principal_id] = held + 1
            return True
        return False

    async def enter(self, principal_id: str) -> None:
        """Wait for a place (after `try_enter` said none was free); `leave` gives it back."""
        await self._enter(principal_id)

    async def _enter(self, principal_id: str) -> None:
        if self.try_enter(principal_id):
            return
        if len(self._waiters) >= self._waiting_capacity:
            self._rejected += 1
            raise AdmissionRejected("full")

        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        waiter = _Waiter(principal_id, future, self._clock() + self._timeout_s)
        self._waiters[waiter] = None
        if self._expiry is None:
            self._expiry = loop.create_task(self._expire(), name="arkvory-admission-expiry")
        try:
            await future
        except asyncio.CancelledError:
            if not future.done() or future.cancelled():
                self._waiters.pop(waiter, None)
                self._cancelled += 1
            elif future.exception() is None:
                # Admitted, then cancelled before it could start: hand the place on.
                self._cancelled += 1
                self._leave(principal_id)
            raise

    def _occupy(self, principal_id: str, held: int) -> None:
        self._active += 1
        self._active_by_principal[principal_id] = held + 1

    def _leave(self, principal_id: str) -> None:
        self._active -= 1
        held = self._active_by_principal[principal_id] - 1
        if held:
            self._active_by_principal[principal_id] = held
        else:
            del self._active_by_principal[principal_id]
        if self._waiters:
            self._admit_waiters()
        if not self._active and self._idle:
            for future in self._idle:
                if not future.done():
                    future.set_result(None)
            self._idle.clear()

    leave = _leave  # give back a place taken with try_enter or enter

    def _admit_waiters(self) -> None:
        admitted = []
        for waiter in self._waiters:
            if self._active >= self._capacity:
                break
            if waiter.future.done():
                continue  # cancelled; its task removes it
            held = self._active_by_principal.get(waiter.principal_id, 0)
            if held < self._per_principal_capacity:
                self._occupy(waiter.principal_id, held)
                admitted.append(waiter)
        for waiter in admitted:
            del self._waiters[waiter]
            waiter.future.set_result(None)

    async def _expire(self) -> None:
        task = asyncio.current_task()
        try:
            while self._waiters:
                now = self._clock()
                oldest = next(iter(self._waiters))
                if oldest.deadline > now:
                    await self._sleep(oldest.deadline - now)
                    continue
                expired = []
                for waiter in self._waiters:
                    if waiter.deadline > now:
                        break
                    expired.append(waiter)
                for waiter in expired:
                    del self._waiters[waiter]
                    if not waiter.future.done():
                        self._timed_out += 1
                        waiter.future.set_exception(AdmissionRejected("timed_out"))
        finally:
            if self._expiry is task:
                self._expiry = None

    # -- draining ----------------------------------------------------------------------------

    def drain(self) -> None:
        """Refuse every new arrival and wake current waiters with `draining`; admitted downloads
        go on. Idempotent."""
        if self._draining:
            return
        self._draining = True
        waiters = list(self._waiters)
        self._waiters.clear()
        for waiter in waiters:
            if not waiter.future.done():
                self._rejected += 1
                waiter.future.set_exception(AdmissionRejected("draining"))
        task, self._expiry = self._expiry, None
        if task is not None:
            task.cancel()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no download is active or `timeout` seconds pass; True if idle."""
        if not self._active:
            return True
        loop = asyncio.get_running_loop()
        idle: asyncio.Future[None] = loop.create_future()
        self._idle.append(idle)
        timer = asyncio.ensure_future(self._sleep(timeout))
        try:
            await asyncio.wait((idle, timer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            if not idle.done():
                idle.cancel()
                self._idle.remove(idle)
        return not self._active


class _Place:
    """One download's place; returned by `Admission.admit`."""

    __slots__ = ("_admission", "_principal_id", "_entered")

    def __init__(self, admission: Admission, principal_id: str) -> None:
        self._admission = admission
        self._principal_id = principal_id
        self._entered = False

    async def __aenter__(self) -> None:
        if self._entered:
            raise RuntimeError("an admission place cannot be entered twice")
        await self._admission._enter(self._principal_id)
        self._entered = True

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._admission._leave(self._principal_id)


def _check_count(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be a whole number ≥ {least}, got {value!r}")
