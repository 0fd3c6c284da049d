"""Background loops, each supervised on its own (house style): started with `tg.start()` so
that a failure before it is up reaches whoever starts it, and after that an unexpected
exception is logged once, with its traceback, and handed to `on_failure` instead of silently
ending the loop or cancelling its siblings (the caller decides: stop serving, exit 75)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.abc import TaskStatus

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
