"""Run one Arkvory process: start-up checks, then our HTTP server, then an orderly stop.

Every refusal to start (exit 2, 3, 78) happens before the port is bound: the Runtime is started
first (there is no ASGI lifespan), then the server listens. SIGTERM means *drain* (report
`draining`, finish transfers, then stop the server, which finishes the requests in flight within
its grace period); a second signal stops at once. Signal handlers only schedule work.

Under systemd (`Type=notify`) the process says READY=1 only once it listens, which is after
the lease, the storage and the policy were checked; STOPPING=1 on drain or failure; and the
watchdog pings come from the serving loop itself (systemd.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal

from starlette.types import ASGIApp

from arkvory.shared.errors import PortUnavailable
from arkvory.shared.http.access_log import AccessLog
from arkvory.shared.http.protocol import protocol_for
from arkvory.shared.http.server import HttpServer, tls_context

from .app import serving_app
from .runtime import IN_POOL, Runtime
from .systemd import ServiceManager, keep_informed

log = logging.getLogger("arkvory.server")

GRACE_S = 5.0  # requests still running when the server stops get this long to finish
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def serve(runtime: Runtime, app: ASGIApp) -> int:
    """Serve until drained, stopped or the lease is lost; returns the exit status."""
    settings = runtime.settings
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    background: set[asyncio.Task] = set()

    manager = ServiceManager.from_environ()
    tls = None
    if settings.tls_cert_file and settings.tls_key_file:
        tls = tls_context(str(settings.tls_cert_file), str(settings.tls_key_file))
    access_log = AccessLog(settings.access_log, settings.trusted_proxies)
    runtime.registry.register(access_log)  # its dropped lines, 0 too when it is off
    server = HttpServer(serving_app(app), protocol_for(runtime), tls=tls, grace_s=GRACE_S, access_log=access_log)
    signals = 0

    def on_stop_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            background.add(loop.create_task(runtime.drain(stop)))
            manager.stopping(f"draining: finishing transfers in flight (at most {settings.drain_timeout_s} s)")
        else:  # a second signal: no more waiting
            server.force()
            stop.set()

    runtime.extra_loops.append(("service manager notification", functools.partial(
        keep_informed,
        manager,
        # Listening comes after the lease, storage and policy checks (Runtime.start). A gateway
        # whose schema is too new is up on purpose, saying why it does not serve; one whose store
        # stopped answering since its check serves what it can (degraded), as in the balancer.
        ready=lambda: server.listening and (runtime.status in IN_POOL or runtime.schema_too_new),
        healthy=runtime.payload_allowed,
        status=lambda: service_status(runtime),
        stopping=lambda: runtime.stopping,
    )))
    for sig in _STOP_SIGNALS:
        loop.add_signal_handler(sig, on_stop_signal)
    try:
        # Supervised loops (pins, lease watcher, control connection); the lease itself already
        # renews in its own thread since it was acquired.
        background.add(await runtime.start_background(stop))
        try:
            await server.start(settings.host, settings.port)
        except OSError as exc:
            raise PortUnavailable(
                f"cannot listen on {runtime.address} (ARKVORY_HOST, ARKVORY_PORT): {exc.strerror or exc}"
            ) from None
        await stop.wait()
        # A lost lease cut the transfers already: nothing is worth waiting for.
        await server.shutdown(force=bool(runtime.exit_status))
    finally:
        for sig in _STOP_SIGNALS:
            loop.remove_signal_handler(sig)
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await server.shutdown(force=True)  # when it never got to stop (a failure above)
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
