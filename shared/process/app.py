"""The Starlette program every process runs; the writer and the gateway add their parts."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from arkvory.shared.download import content
from arkvory.shared.errors import Unavailable
from arkvory.shared.http.edge import EXCEPTION_HANDLERS, RequestContext, send_error

from . import health
from .runtime import Runtime


class ServingGate:
    """While the lease is lost (or the schema is too new) every API request gets 503."""

    def __init__(self, app: ASGIApp, runtime: Runtime) -> None:
        self.app = app
        self.runtime = runtime

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"].startswith("/api/")
            and not self.runtime.may_serve
        ):
            await send_error(scope, send, Unavailable(f"this process cannot serve: {self.runtime.status}"))
            return
        await self.app(scope, receive, send)


def build_app(
    runtime: Runtime,
    routes: Sequence[BaseRoute] = (),
    middleware: Sequence[Middleware] = (),
) -> Starlette:
    app = Starlette(
        routes=[*health.routes, *content.routes, *routes],
        middleware=[
            *middleware,
            Middleware(ServingGate, runtime=runtime),
        ],
        exception_handlers=EXCEPTION_HANDLERS,
    )
    # SPEC §6: an unknown route is 404. Starlette would answer `/path/` with a 307 to `/path`.
    app.router.redirect_slashes = False
    app.state.runtime = runtime
    return app


def serving_app(app: Starlette) -> ASGIApp:
    """What the server runs: request ids and metrics around everything, then the content
    routes' fast path (content.ContentDispatch), then the Starlette program."""
    runtime: Runtime = app.state.runtime
    return RequestContext(content.ContentDispatch(app), metrics=runtime.metrics, stopping=lambda: runtime.stopping)
