"""A fake monotonic clock and sleep for the unit tests of time-driven code (throttle, admission)."""

from __future__ import annotations

import asyncio

NS = 1_000_000_000


class FakeTime:
    """A clock counting whole nanoseconds. With `auto=True`, `sleep` jumps the clock forward at
    once; otherwise sleepers wait until the test calls `advance`."""

    def __init__(self, auto: bool = True) -> None:
        self.ns = 1_000 * NS  # not zero, as a monotonic clock would not be
        self.auto = auto
        self.sleeps: list[float] = []
        self._sleepers: list[tuple[int, asyncio.Future[None]]] = []

    def clock(self) -> float:
        return self.ns / NS

    def advance(self, seconds: float) -> None:
        self.advance_ns(round(seconds * NS))

    def advance_ns(self, ns: int) -> None:
        self.ns += ns
        for deadline, future in self._sleepers:
            if deadline <= self.ns and not future.done():
                future.set_result(None)

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if self.auto:
            await asyncio.sleep(0)  # whoever was woken runs at the instant it was served
            self.advance(seconds)
            return
        entry = (self.ns + round(seconds * NS), asyncio.get_running_loop().create_future())
        self._sleepers.append(entry)
        try:
            await entry[1]
        finally:
            self._sleepers.remove(entry)


async def settle(rounds: int = 20) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)
