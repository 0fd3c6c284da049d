"""Run one Arkvory process: start-up checks, then uvicorn, then an orderly stop.

We drive `uvicorn.Server` ourselves instead of using a lifespan because every refusal to start
(exit 2, 3, 78) must happen before the port is bound, and because SIGTERM must mean *drain*
(report `draining`, finish transfers, then stop) rather than uvicorn's immediate shutdown.
Signal handlers only schedule work; a second signal forces the exit (as uvicorn does).

Under systemd (`Type=notify`) the process says READY=1 only once it listens, which is after
the lease, the storage and the policy were checked; STOPPING=1 on drain or failure; and the
watchdog pings come from the serving loop itself (systemd.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from types import FrameType

import uvicorn
from starlette.types import ASGIApp

from arkvory.shared.http.protocol import protocol_for

from .app import serving_app
from .runtime import IN_POOL, Runtime
from .systemd import ServiceManager, keep_informed

log = logging.getLogger("arkvory.server")


class _DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_first_signal: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_first_signal = on_first_signal
        self._signalled = False
        self.listening = asyncio.Event()

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self.listening.set()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._signalled:
            self.should_exit = self.force_exit = True
            return
        self._signalled = True
        self._on_first_signal()


async def serve(runtime: Runtime, app: ASGIApp) -> int:
    """Serve until drained, stopped or the lease is lost; returns the exit status."""
    settings = runtime.settings
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    background: set[asyncio.Task] = set()

    manager = ServiceManager.from_environ()

    def begin_drain() -> None:
        task = loop.create_task(runtime.drain(stop))
        background.add(task)
        manager.stopping(f"draining: finishing transfers in flight (at most {settings.drain_timeout_s} s)")

    config = uvicorn.Config(
        serving_app(app),
        host=settings.host,
        port=settings.port,
        lifespan="off",
        http=protocol_for(runtime),  # httptools, with bounded request heads (shared/http/protocol.py)
        ws="none",
        log_config=None,
        access_log=False,
        proxy_headers=False,  # nothing reads the client address; the middleware costs per request
        server_header=False,
        timeout_graceful_shutdown=5,
        ssl_certfile=str(settings.tls_cert_file) if settings.tls_cert_file else None,
        ssl_keyfile=str(settings.tls_key_file) if settings.tls_key_file else None,
    )
    server = _DrainingServer(config, lambda: loop.call_soon_threadsafe(begin_drain))

    async def stop_server() -> None:
        await stop.wait()
        server.should_exit = True
        if runtime.exit_status:
            server.force_exit = True  # lease lost: transfers were already cut

    runtime.extra_loops.append(("service manager notification", functools.partial(
        keep_informed,
        manager,
        # Listening comes after the lease, storage and policy checks (Runtime.start). A gateway
        # whose schema is too new is up on purpose, saying why it does not serve; one whose store
        # stopped answering since its check serves what it can (degraded), as in the balancer.
        ready=lambda: server.listening.is_set() and (runtime.status in IN_POOL or runtime.schema_too_new),
        healthy=runtime.payload_allowed,
        status=lambda: service_status(runtime),
        stopping=lambda: runtime.stopping,
    )))
    try:
        # Supervised loops (pins, lease watcher, control connection); the lease itself already
        # renews in its own thread since it was acquired.
        background.add(await runtime.start_background(stop))
        background.add(loop.create_task(stop_server()))
        await server.serve()
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await runtime.close()
        manager.close()
    log.info("stopped with exit status %d", runtime.exit_status)
    return runtime.exit_status


def service_status(runtime: Runtime) -> str:
    """What `systemctl status` shows: role, slot, state, and the lease trust left."""
    settings = runtime.settings
    where = (
        f"slot {settings.shared.slot} of {settings.shared.slots}" if settings.shared else "standalone, no lease"
    )
    state = f"unavailable: {runtime.failure}" if runtime.failure else runtime.status
    if state == "degraded":
        state = "degraded: the object store does not answer (serving the read cache and what needs no store)"
    if runtime.schema_too_new:
        state = "unavailable: the database schema is newer than this code"
    text = f"{'writer' if settings.is_writer else 'gateway'}, {where}: {state}"
    if runtime.lease is not None:
        text += f"; lease trusted {runtime.lease.trust_remaining():.1f} s more"
    return text
