"""The Starlette program every process runs; the writer and the gateway add their parts."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute

from . import content, health
from .http import EXCEPTION_HANDLERS, RequestContext
from .runtime import Runtime


def build_app(
    runtime: Runtime,
    routes: Sequence[BaseRoute] = (),
    middleware: Sequence[Middleware] = (),
) -> Starlette:
    app = Starlette(
        routes=[*health.routes, *content.routes, *routes],
        middleware=[Middleware(RequestContext, metrics=runtime.metrics), *middleware],
        exception_handlers=EXCEPTION_HANDLERS,
    )
    app.state.runtime = runtime
    return app
