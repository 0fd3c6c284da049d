"""Background loops, each supervised on its own (house style): started with `tg.start()` so
that a failure before it is up reaches whoever starts it, and after that an unexpected
exception is logged once, with its traceback, and handed to `on_failure` instead of silently
ending the loop or cancelling its siblings (the caller decides: stop serving, exit 75).

And what those loops say about the database (issue 13 item 17): each loop that reconnects or
retries reports its attempts to `DATABASE`, so that an outage costs the process one line when
the database stops answering and one when it answers again, whatever the number of loops and
retries; each failed attempt goes to debug only, with its traceback (asyncpg's own pool
retries too: logs.QuietPoolRetries).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import asyncpg
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from arkvory.shared.db import pooled
from arkvory.shared.errors import DatabaseUnavailable

log = logging.getLogger("arkvory.supervision")

OnFailure = Callable[[str, BaseException], Awaitable[None]]


class _Started:
    """Passes `started()` through and remembers that it happened."""

    def __init__(self, outer: TaskStatus) -> None:
        self.outer = outer
        self.done = False

    def started(self, value: Any = None) -> None:
        self.done = True
        self.outer.started(value)


async def supervised(
    name: str,
    run: Callable[..., Awaitable[None]],
    on_failure: OnFailure,
    expected: tuple[type[BaseException], ...] = (),
    *,
    task_status: TaskStatus = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run `run(task_status=...)`; `expected` failures are logged without a traceback."""
    status = _Started(task_status)
    try:
        await run(task_status=status)
    except Exception as exc:
        if not status.done:
            raise  # tg.start() raises it to the caller: the process does not start
        if isinstance(exc, expected):
            log.error("%s stopped: %s", name, exc)
        else:
            log.error("%s failed unexpectedly", name, exc_info=exc)
        await on_failure(name, exc)


class DatabaseReachability:
    """Whether this process reaches its database, as its retrying loops see it.

    The first loop that fails makes the process log "database unreachable: <reason>" (warning);
    once every loop that failed has succeeded again it logs "database reachable again" (info).
    So a reporting loop must keep retrying until it succeeds or the process ends (a lost lease
    ends it). Thread-safe: the lease renews in a thread of its own.

    `attempts_failed` counts the failed attempts of each loop that ever reported or that the
    process said it runs (`expect`), 0 for one that never failed, for the metric
    `arkvory_database_errors_total{loop}`.
    """

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._log = logger or logging.getLogger("arkvory.database")
        self._lock = threading.Lock()
        self._failing: set[str] = set()
        self.attempts_failed: dict[str, int] = {}

    @property
    def reachable(self) -> bool:
        return not self._failing

    def failed(self, loop: str, problem: BaseException | str) -> None:
        """One attempt of `loop` to reach the database failed."""
        reason = describe_failure(problem)
        traceback = problem if isinstance(problem, BaseException) else None
        self._log.debug("%s: attempt failed: %s", loop, reason, exc_info=traceback)
        with self._lock:
            went_down = not self._failing
            self._failing.add(loop)
            self.attempts_failed[loop] = self.attempts_failed.get(loop, 0) + 1
        if went_down:
            self._log.warning("database unreachable: %s (%s)", reason, loop)

    def expect(self, *loops: str) -> None:
        """Loops that will report: their series exist from now on, as 0, so that a loop whose
        very first attempt fails is counted by `increase()` too (a series that first appears
        at 1 shows no increase)."""
        with self._lock:
            for loop in loops:
                self.attempts_failed.setdefault(loop, 0)

    def succeeded(self, loop: str) -> None:
        """An attempt of `loop` succeeded (cheap when nothing failed: called every round)."""
        if loop not in self.attempts_failed:
            # The loop's series exists from its first round on, as 0 (a dashboard's and an
            # alert's series exist before anything failed).
            self.attempts_failed.setdefault(loop, 0)
        if loop not in self._failing:
            return
        with self._lock:
            if loop not in self._failing:
                return
            self._failing.discard(loop)
            came_back = not self._failing
        if came_back:
            self._log.info("database reachable again")


# What a loop that reaches the database retries on (anything else is a bug: supervised's business).
DATABASE_ERRORS = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, DatabaseUnavailable)


async def read_every(
    seconds: float,
    loop: str,
    pool_of: Callable[[], Any],
    read: Callable[[Any], Awaitable[None]],
    *,
    task_status: Any = anyio.TASK_STATUS_IGNORED,
) -> None:
    """A loop that reads, for export, what only the database knows: `read(conn)` on a pool
    connection (`pool_of()` gives the pool) every `seconds`, so that a scrape never queries the
    database. The first read comes before `started()`, so the values are there for the first
    scrape; a read that fails keeps the last values and is reported to DATABASE as `loop`."""
    DATABASE.expect(loop)
    started = False
    while True:
        try:
            async with pooled(pool_of()) as conn:
                await read(conn)
            DATABASE.succeeded(loop)
        except DATABASE_ERRORS as exc:
            DATABASE.failed(loop, exc)  # the last values stay
        if not started:
            started = True
            task_status.started()
        await asyncio.sleep(seconds)


def describe_failure(problem: BaseException | str) -> str:
    if isinstance(problem, str):
        return problem
    text = str(problem)
    if isinstance(problem, TimeoutError) and not text:
        text = "no answer in time"
    return f"{problem.__class__.__name__}: {text}" if text else problem.__class__.__name__


# The process's one view (a process is one writer, gateway or worker).
DATABASE = DatabaseReachability()


def observe_database(registry: CollectorRegistry, reachability: DatabaseReachability = DATABASE) -> None:
    """Export the failed database attempts of this process's loops (every process kind)."""
    registry.register(_DatabaseErrorsCollector(reachability))


class _DatabaseErrorsCollector(Collector):
    def __init__(self, reachability: DatabaseReachability) -> None:
        self.reachability = reachability

    def collect(self):
        errors = CounterMetricFamily(
            "arkvory_database_errors",
            "Failed attempts to reach the database, by the loop that made them (one outage "
            "counts once per retry of each loop)",
            labels=["loop"],
        )
        for loop, failed in sorted(self.reachability.attempts_failed.items()):
            errors.add_metric([loop], failed)
        yield errors
