"""The worker process: standby until it holds the worker lock, then active until it loses the
lock (back to standby) or is told to stop (SIGTERM: drain, exit 0).

    starting -> standby <-> active -> draining -> exit 0

Becoming active = a new activation (lock.py): restart recovery (recovery.py) first, then the
runner (runner.py) claims and runs tasks. Losing the lock connection ends the activation at
once: the running kinds are cancelled where they are (their writes would be refused by the
fence anyway), and the worker goes back to taking the lock; the next activation, here or in a
standby worker, settles the tasks by the restart table. A database error while recovering, or
an end of a task that could not be recorded, ends the activation the same way.

A planned stop (SIGTERM) leaves for the next start exactly what a crash would, minus the
surprise: queued tasks stay queued, and a task that was running stays `running` (its kind was
asked to stop at its next progress or checkpoint, bounded by ARKVORY_DRAIN_TIMEOUT_SECONDS), so
the next activation's restart recovery applies its policy: `resume` continues from its last
checkpoint, `retry` starts again, `fail` ends `failed` with `server_restarted`.

Signal handlers only set flags; a second SIGTERM/SIGINT cancels the running kinds at once.
Signals within SAME_STOP_S of the first are one stop: a terminal's Ctrl-C reaches a whole
process group, and a supervisor in that group may forward its own signal too.

Under systemd (`Type=notify`) the worker says READY=1 once its health port listens and it is
either active or standing by (STATUS says which), STOPPING=1 on SIGTERM, and pings the watchdog
from its own event loop (arkvory.shared.process.systemd).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
import uuid
from typing import Any

import anyio
import asyncpg
from prometheus_client import CollectorRegistry

from arkvory.shared.auth.identity import KeyRing
from arkvory.shared.cluster.lease_history import LeaseHistory
from arkvory.shared.cluster.supervision import DATABASE, supervised
from arkvory.shared.http.access_log import AccessLog
from arkvory.shared.http.server import HttpServer, tls_context
from arkvory.shared.process.systemd import ServiceManager, keep_informed
from arkvory.shared.settings import Settings
from arkvory.shared.storage import BlobStorage
from arkvory.writer.maintenance import kinds

from .health import build_health_app
from .lock import LOOP as LOCK_LOOP, Activation, WorkerLock
from .metrics import WorkerMetrics
from .recovery import recover
from .runner import RecordingFailed, Runner

log = logging.getLogger("arkvory.worker")

EXIT_FAILED = 75  # the health server could not listen: the service manager restarts us
HEALTH_GRACE_S = 2.0  # health requests still running at the stop get this long
RETRY_AFTER_FAILURE_S = 2.0
SAME_STOP_S = 1.0  # stop signals this close to the first are the same stop
_ACTIVATION_ERRORS = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, RecordingFailed)


class WorkerProcess:
    def __init__(
        self,
        settings: Settings,
        keys: KeyRing,
        pool: asyncpg.Pool,
        storage: BlobStorage,
        schema_version: int,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.keys = keys
        self.pool = pool
        self.storage = storage
        self.schema_version = schema_version
        self.registry = registry or CollectorRegistry()
        self.metrics = WorkerMetrics(self.registry, kinds.KINDS)
        # Every slot's lease as the database knows it: the worker holds no slot, so it reports
        # any process's lost lease (shared/cluster/lease_history.py).
        self.lease_history = LeaseHistory()
        self.registry.register(self.lease_history)
        DATABASE.expect(LOCK_LOOP)
        self.state = "starting"
        self.exit_status = 0
        self.lock = WorkerLock(settings.database_url, self._on_task_event)
        self._runner: Runner | None = None
        self._stop = asyncio.Event()
        self._signals = 0
        self._first_signal_at = 0.0
        self.service_manager = ServiceManager.from_environ()

    # -- state for the health endpoints -----------------------------------------------------

    def running_tasks(self) -> list[dict[str, Any]]:
        runner = self._runner
        if runner is None:
            return []
        return [
            {"id": str(ctx.task_id), "kind": ctx.kind, "usage": dict(ctx.usage), "stopping": ctx.stop_reason}
            for ctx in list(runner.running.values())
        ]

    def service_status(self) -> str:
        """What `systemctl status` shows."""
        if self.state == "active":
            kinds_running = sorted(task["kind"] for task in self.running_tasks())
            return f"worker: active, {len(kinds_running)} task(s) running {' '.join(kinds_running)}".rstrip()
        if self.state == "standby":
            return "worker: standby, another worker is active; taking over when it stops"
        return f"worker: {self.state}"

    # -- signals and notifications ----------------------------------------------------------

    def request_stop(self) -> None:
        now = time.monotonic()
        if self._signals and now - self._first_signal_at < SAME_STOP_S:
            log.debug("another stop signal within %.0f s of the first: the same stop", SAME_STOP_S)
            return
        self._signals += 1
        if self._signals == 1:
            self._first_signal_at = now
            log.info("stopping: no more tasks are claimed; running tasks stop at their next step")
            self.state = "draining"
            self._stop.set()
            self.service_manager.stopping(self.service_status())
            if self._runner is not None:
                self._runner.stop()
        elif self._runner is not None:
            log.warning("second stop signal: cancelling the running tasks where they are")
            self._runner.force_stop()

    def _on_task_event(self, task_id: uuid.UUID, event: str) -> None:
        if self._runner is not None:
            self._runner.on_task_event(task_id, event)

    # -- the process ------------------------------------------------------------------------

    async def run(self, sock: socket.socket) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        server = self._health_server()
        manager = self.service_manager
        informing = anyio.CancelScope()
        reading = anyio.CancelScope()

        async def read_lease_history(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
            with reading:
                await self.lease_history.run(lambda: self.pool, task_status=task_status)

        async def inform() -> None:
            with informing:
                await keep_informed(
                    manager,
                    ready=lambda: server.listening and (self.state == "active" or self.lock.standing_by),
                    healthy=lambda: server.listening,
                    status=self.service_status,
                    stopping=self._stop.is_set,
                )

        try:
            async with anyio.create_task_group() as tg:
                # Read once before the health port serves: the series are there from the first scrape.
                await tg.start(supervised, "lease history", read_lease_history, self._history_failed)
                try:
                    await server.start(sock=sock)
                except OSError:
                    log.exception("the health server could not listen; stopping the worker (exit %d)", EXIT_FAILED)
                    self.exit_status = EXIT_FAILED
                    self.request_stop()
                tg.start_soon(inform)
                await self._take_turns()
                informing.cancel()
                reading.cancel()
        finally:
            await server.shutdown()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            await self.lock.release()
            manager.close()
        log.info("stopped with exit status %d", self.exit_status)
        return self.exit_status

    async def _take_turns(self) -> None:
        """Standby, active, standby... until told to stop."""
        while not self._stop.is_set():
            self.state = "standby"
            activation = await self._acquire_unless_stopped()
            if activation is None:
                return
            lost = await self._active(activation)
            if lost is None:
                return  # drained
            self.metrics.locks_lost.inc()
            log.error("no longer the active worker (%s): running tasks stopped; taking the lock again", lost)
            self.lock.drop()
            if not self._stop.is_set():
                await asyncio.sleep(RETRY_AFTER_FAILURE_S)

    async def _acquire_unless_stopped(self) -> Activation | None:
        activation: Activation | None = None
        async with anyio.create_task_group() as tg:

            async def acquire() -> None:
                nonlocal activation
                activation = await self.lock.acquire()
                tg.cancel_scope.cancel()

            async def stopped() -> None:
                await self._stop.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(acquire)
            tg.start_soon(stopped)
        return activation

    async def _active(self, activation: Activation) -> str | None:
        """One activation; returns why it was lost, or None once drained."""
        runner = Runner(
            activation,
            pool=self.pool,
            storage=self.storage,
            settings=self.settings,
            metrics=self.metrics,
            kinds=kinds.KINDS,
        )
        lost: str | None = None
        self.state = "draining" if self._stop.is_set() else "active"
        self.metrics.active.set(1)
        try:
            async with anyio.create_task_group() as tg:

                async def watch() -> None:
                    nonlocal lost
                    lost = await self.lock.wait_lost()
                    tg.cancel_scope.cancel()

                tg.start_soon(watch)
                async with self.pool.acquire(timeout=10) as conn:
                    adopted = await recover(conn, activation, self.metrics)
                self._runner = runner
                if self._stop.is_set():
                    runner.stop()
                await runner.run(adopted)
                tg.cancel_scope.cancel()
        except* _ACTIVATION_ERRORS as group:
            lost = "; ".join(f"{exc.__class__.__name__}: {exc}" for exc in group.exceptions)
        finally:
            self._runner = None
            self.metrics.active.set(0)
            self.metrics.tasks_running.set(0)
        return lost

    async def _history_failed(self, name: str, exc: BaseException) -> None:
        # Supervised: logged with its traceback; then the worker stops as for its health server.
        self.exit_status = EXIT_FAILED
        self.request_stop()

    # -- health -----------------------------------------------------------------------------

    def _health_server(self) -> HttpServer:
        settings = self.settings
        tls = None
        if settings.tls_cert_file and settings.tls_key_file:
            tls = tls_context(str(settings.tls_cert_file), str(settings.tls_key_file))
        access_log = AccessLog(settings.access_log, settings.trusted_proxies)
        self.registry.register(access_log)
        return HttpServer(build_health_app(self), tls=tls, grace_s=HEALTH_GRACE_S, access_log=access_log)
