"""The writer: the shared program plus every route that changes something."""

from __future__ import annotations

import asyncio

from starlette.applications import Starlette
from starlette.middleware import Middleware

from shared.app import build_app
from shared.http import RequestGuard
from shared.runtime import Runtime

from . import accounts, artifacts, assets, openapi, packages, permissions, repositories, tokens, uploads
from .idempotency import InFlightKeys, RecordedResults
from .maintenance import diagnostics
from .tasks import api as tasks

# Every writer module with routes: its `routes` are served and its `OPENAPI_PATHS` documented.
ROUTE_MODULES = (
    repositories, packages, assets, artifacts, accounts, tokens, permissions, uploads, tasks,
    diagnostics, openapi,
)


def build_writer_app(runtime: Runtime) -> Starlette:
    app = build_app(
        runtime,
        routes=[route for module in ROUTE_MODULES for route in module.routes],
        middleware=[Middleware(RequestGuard)],
    )
    app.state.upload_slots = asyncio.Semaphore(runtime.settings.max_uploads)
    app.state.idempotency_keys = InFlightKeys()
    app.state.idempotency_results = RecordedResults()
    app.state.openapi_json = openapi.document_bytes(ROUTE_MODULES)
    return app
