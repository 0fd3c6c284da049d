"""The worker's health endpoints on ARKVORY_HOST:ARKVORY_WORKER_PORT (SPEC §8).

    GET /health/live     public: {"status": "ok"} while the process runs
    GET /health/status   public: 200 {"status": "active"}, or 503 {"status": "standby" |
                         "draining" | "starting"} with Retry-After: 2
    GET /health/ready    needs a key: status, role "worker", the running tasks, schemaVersion
                         (200 only when active)
    GET /health/metrics  needs a key unless ARKVORY_PUBLIC_METRICS: Prometheus text

Any credential will do, as on the other processes: a keys-file token, or a database
credential (looked up on every request: the worker keeps no credential cache, since no LISTEN
tells it of revocations, and a scrape every few seconds costs one indexed query).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from arkvory.shared.auth.credentials import CredentialCache, resolve
from arkvory.shared.errors import Unauthorized
from arkvory.shared.http.edge import EXCEPTION_HANDLERS, RequestGuard

if TYPE_CHECKING:
    from .process import WorkerProcess

RETRY_AFTER = {"Retry-After": "2"}


@dataclasses.dataclass
class _CredentialSource:
    """What `credentials.resolve` reads of a process: the keys, a (never listening, so never
    answering from memory) credential cache, and the pool."""

    keys: object
    pool: object
    control: SimpleNamespace = dataclasses.field(default_factory=lambda: SimpleNamespace(credentials=CredentialCache()))


def _worker(request: Request) -> WorkerProcess:
    return request.app.state.worker


async def _require_key(request: Request) -> None:
    worker = _worker(request)
    source = _CredentialSource(keys=worker.keys, pool=worker.pool)
    principal = await resolve(source, request.headers.get("authorization"))  # type: ignore[arg-type]
    if principal.is_anonymous:
        raise Unauthorized("this endpoint needs a key")


async def live(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def status(request: Request) -> Response:
    state = _worker(request).state
    if state == "active":
        return JSONResponse({"status": state})
    return JSONResponse({"status": state}, status_code=503, headers=RETRY_AFTER)


async def ready(request: Request) -> Response:
    await _require_key(request)
    worker = _worker(request)
    body = {
        "status": worker.state,
        "role": "worker",
        "tasks": worker.running_tasks(),
        "schemaVersion": worker.schema_version,
    }
    if worker.state != "active":
        return JSONResponse(body, status_code=503, headers=RETRY_AFTER)
    return JSONResponse(body)


async def metrics(request: Request) -> Response:
    worker = _worker(request)
    if not worker.settings.public_metrics:
        await _require_key(request)
    return Response(generate_latest(worker.registry), media_type=CONTENT_TYPE_LATEST)


def build_health_app(worker: WorkerProcess) -> RequestGuard:
    app = Starlette(
        routes=[
            Route("/health/live", live, methods=["GET", "HEAD"]),
            Route("/health/status", status, methods=["GET", "HEAD"]),
            Route("/health/ready", ready, methods=["GET", "HEAD"]),
            Route("/health/metrics", metrics, methods=["GET", "HEAD"]),
        ],
        exception_handlers=EXCEPTION_HANDLERS,
    )
    app.router.redirect_slashes = False
    app.state.worker = worker
    return RequestGuard(app)
