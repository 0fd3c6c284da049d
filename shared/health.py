"""Health endpoints (SPEC §8): status for the balancer, readiness for operators, metrics."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .errors import Unauthorized
from .credentials import resolve
from .runtime import Runtime

RETRY_AFTER = {"Retry-After": "2"}


def _runtime(request: Request) -> Runtime:
    return request.app.state.runtime


async def _require_key(request: Request) -> None:
    # Any credential kind will do (keys file, managed key, token, session): health is not secret
    # from a known principal, only from the anonymous internet.
    principal = await resolve(_runtime(request), request.headers.get("authorization"))
    if principal.is_anonymous:
        raise Unauthorized("this endpoint needs a key")


async def status(request: Request) -> Response:
    state = _runtime(request).status
    if state == "ready":
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": state}, status_code=503, headers=RETRY_AFTER)


async def live(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> Response:
    await _require_key(request)
    runtime = _runtime(request)
    bandwidth = runtime.bandwidth
    body = {
        "status": runtime.status,
        "role": runtime.settings.role,
        "writable": runtime.settings.is_writer and runtime.status == "ready",
        "sharedDownloads": runtime.shared_downloads(),
        "transfers": {
            "downloads": {
                "admission": runtime.admission.snapshot(),
                "bandwidth": {
                    "bytesPerSecond": bandwidth.bytes_per_second,
                    "perPrincipalBytesPerSecond": bandwidth.per_principal_bytes_per_second,
                    "burstBytes": bandwidth.burst_bytes,
                    "grantedBytes": bandwidth.granted_bytes,
                },
            }
        },
        "schemaVersion": runtime.schema_version,
    }
    if runtime.status != "ready":
        return JSONResponse(body, status_code=503, headers=RETRY_AFTER)
    return JSONResponse(body)


async def metrics(request: Request) -> Response:
    runtime = _runtime(request)
    if not runtime.settings.public_metrics:
        await _require_key(request)
    return Response(generate_latest(runtime.registry), media_type=CONTENT_TYPE_LATEST)


routes = [
    Route("/health/status", status, methods=["GET", "HEAD"]),
    Route("/health/live", live, methods=["GET", "HEAD"]),
    Route("/health/ready", ready, methods=["GET", "HEAD"]),
    Route("/health/metrics", metrics, methods=["GET", "HEAD"]),
]
