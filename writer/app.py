"""The writer: the shared program plus every route that changes something."""

from __future__ import annotations

import asyncio

from starlette.applications import Starlette
from starlette.middleware import Middleware

from shared.app import build_app
from shared.http import RequestGuard
from shared.runtime import Runtime

from . import artifacts, repositories


def build_writer_app(runtime: Runtime) -> Starlette:
    app = build_app(
        runtime,
        routes=[*repositories.routes, *artifacts.routes],
        middleware=[Middleware(RequestGuard)],
    )
    app.state.upload_slots = asyncio.Semaphore(runtime.settings.max_uploads)
    return app
