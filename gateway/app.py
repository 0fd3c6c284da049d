"""The read gateway: the shared program behind a gate that refuses every change (SPEC §6)."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

from arkvory.shared.errors import ReadOnly
from arkvory.shared.http.edge import RequestGuard, send_error
from arkvory.shared.process.app import build_app
from arkvory.shared.process.runtime import Runtime

from .console_hint import ConsoleHint

READ_METHODS = frozenset({"GET", "HEAD"})


class ReadOnlyGate:
    """Answers 405 `read_only` to any other method on any path, before authentication."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in READ_METHODS:
            await send_error(
                scope, send, ReadOnly("this is a read gateway: only GET and HEAD are served")
            )
            return
        await self.app(scope, receive, send)


def build_gateway_app(runtime: Runtime) -> Starlette:
    # A browser that opens /console/ here is told where the console is (console_hint.py).
    return build_app(runtime, middleware=[Middleware(ReadOnlyGate), Middleware(RequestGuard), Middleware(ConsoleHint)])
