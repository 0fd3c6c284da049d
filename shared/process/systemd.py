"""Telling systemd the truth (`Type=notify`, `WatchdogSec=`): the notify protocol, written
straight to `$NOTIFY_SOCKET`, and the loop that sends READY=1, STATUS=, STOPPING=1 and the
watchdog pings for one process.

The protocol is a datagram of `KEY=value` lines on a Unix socket (an abstract one when the
path starts with `@`); without `NOTIFY_SOCKET` every call does nothing, so the same process runs
under systemd, under `arkvory dev` or in a test. The watchdog is on when `WATCHDOG_USEC` is set
and `WATCHDOG_PID` (when set) is this process.

Where the ping comes from matters: the lease renews in a thread of its own, so a ping from
there would prove nothing about the event loop that serves requests. `keep_informed` runs *on
the serving loop*, and pings only when that loop woke it on time and the process says it may
serve (`healthy`: for serve, payload is allowed — the lease is trusted, the read pins are
written, no background loop failed; for the worker, its loop and health server run). A wedged
loop sends nothing, so systemd kills and restarts the process after `WatchdogSec=`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping

import anyio
from anyio.abc import TaskStatus

log = logging.getLogger("arkvory.systemd")

STATUS_EVERY_S = 2.0
# Pings per watchdog period: one missed ping (a pause of the loop) costs no kill.
PINGS_PER_PERIOD = 4
# How often the loop looks: READY and STOPPING follow within this, and each look measures how
# late the loop woke it (a wake-up costs microseconds).
TICK_S = 0.1
# A look that woke this much later than asked means the loop was blocked that long: no ping
# for that period. A loop that keeps stalling this long is killed by the watchdog.
LATE_LIMIT_S = 1.0


class ServiceManager:
    """The notify socket of the service manager that started us, if any."""

    def __init__(self, address: str | bytes | None, watchdog_s: float | None = None) -> None:
        self.address = address
        self.watchdog_s = watchdog_s
        self._sock: socket.socket | None = None
        self._failed_once = False
        self.said_stopping = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> ServiceManager:
        environ = os.environ if environ is None else environ
        path = environ.get("NOTIFY_SOCKET", "")
        address: str | bytes | None = None
        if path.startswith("@"):
            address = b"\0" + path[1:].encode()  # Linux abstract namespace
        elif path.startswith("/"):
            address = path
        return cls(address, _watchdog_seconds(environ))

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *lines: str) -> bool:
        """Send one datagram; False when there is no socket or it could not be sent (never
        raises: systemd not listening must not stop a server)."""
        if self.address is None or not lines:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto("\n".join(lines).encode(), self.address)
            return True
        except OSError as exc:
            if not self._failed_once:  # once: a gone socket would otherwise log every 2 s
                self._failed_once = True
                log.warning("cannot notify the service manager at %r: %s", self.address, exc)
            return False

    def ready(self, status: str) -> bool:
        return self.notify("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def status(self, status: str) -> bool:
        return self.notify(f"STATUS={status}")

    def stopping(self, status: str) -> bool:
        """Once: the first reason to stop is the one systemd shows."""
        if self.said_stopping:
            return False
        self.said_stopping = True
        return self.notify("STOPPING=1", f"STATUS={status}")

    def watchdog(self) -> bool:
        return self.watchdog_s is not None and self.notify("WATCHDOG=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _watchdog_seconds(environ: Mapping[str, str]) -> float | None:
    usec = environ.get("WATCHDOG_USEC", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    pid = environ.get("WATCHDOG_PID", "")
    if pid and pid != str(os.getpid()):
        return None  # meant for another process (a parent that exec'd us is the same pid)
    return int(usec) / 1e6


async def keep_informed(
    manager: ServiceManager,
    *,
    ready: Callable[[], bool],
    healthy: Callable[[], bool],
    status: Callable[[], str],
    stopping: Callable[[], bool],
    clock: Callable[[], float] = time.monotonic,
    task_status: TaskStatus = anyio.TASK_STATUS_IGNORED,
) -> None:
    """READY=1 once `ready()`; then STATUS= every 2 s, WATCHDOG=1 every quarter of the
    watchdog period while `healthy()` and the loop answered every tick since the last ping in
    time, and STOPPING=1 as soon as `stopping()`. Runs until cancelled, on the loop whose
    liveness the pings prove."""
    task_status.started()
    if not manager.enabled:
        return
    while not ready():
        if stopping():
            manager.stopping(status())
            return
        await asyncio.sleep(TICK_S)
    manager.ready(status())
    log.info("told the service manager: ready (%s)", status())
    ping_every = manager.watchdog_s / PINGS_PER_PERIOD if manager.watchdog_s else None
    last_ping = last_status = clock()
    worst_late = 0.0  # the loop's worst lateness since the last ping
    was_healthy = True
    while True:
        asked = clock() + TICK_S
        await asyncio.sleep(TICK_S)
        now = clock()
        worst_late = max(worst_late, now - asked)
        if stopping():
            manager.stopping(status())  # sent once
        if ping_every is not None and now - last_ping >= ping_every:
            now_healthy = healthy()
            if now_healthy and worst_late < LATE_LIMIT_S:
                manager.watchdog()
                last_ping, worst_late = now, 0.0
            elif worst_late >= LATE_LIMIT_S:
                worst_late = 0.0  # this window is lost; the next one starts now
                last_ping = now
            if now_healthy != was_healthy:
                was_healthy = now_healthy
                log.log(
                    logging.INFO if now_healthy else logging.WARNING,
                    "watchdog pings %s (%s)", "resumed" if now_healthy else "withheld", status(),
                )
        if now - last_status >= STATUS_EVERY_S:
            last_status = now
            manager.status(status())
