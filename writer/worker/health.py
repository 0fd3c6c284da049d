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

from typing import Any, Protocol

import asyncpg
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from arkvory.shared.auth.credentials import CredentialCache, resolve
from arkvory.shared.auth.identity import KeyRing
from arkvory.shared.errors import Unauthorized
from arkvory.shared.http.access_log import note_principal
from arkvory.shared.http.edge import EXCEPTION_HANDLERS, RequestGuard, RequestIds
from arkvory.shared.settings import Settings

RETRY_AFTER = {"Retry-After": "2"}


class WorkerState(Protocol):
    """What the health routes read of the worker process (process.WorkerProcess)."""

    settings: Settings
    keys: KeyRing
    pool: asyncpg.Pool
    registry: CollectorRegistry
    state: str
    schema_version: int

    def running_tasks(self) -> list[dict[str, Any]]: ...


def _worker(request: Request) -> WorkerState:
    return request.app.state.worker


async def _require_key(request: Request) -> None:
    worker = _worker(request)
    # A fresh cache that never listens, so never answers from memory (see the docstring).
    cache = CredentialCache()
    principal = await resolve(worker.keys, cache, worker.pool, request.headers.get("authorization"))
    note_principal(request.scope, principal.id)
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


def build_health_app(worker: WorkerState) -> RequestIds:
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
    # Ids outermost: the guard's own refusals carry one too.
    return RequestIds(RequestGuard(app))
