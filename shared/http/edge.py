"""The HTTP edge every process shares: request ids, error JSON (SPEC §6) and HTTP metrics.

Pure ASGI middleware rather than `BaseHTTPMiddleware`: it wraps every payload chunk, so it
must cost a function call, not a task and a queue.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import itertools
import secrets
from collections.abc import Callable

import asyncpg
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from arkvory.shared.errors import (
    ApiError,
    Busy,
    Conflict,
    InvalidInput,
    MethodNotAllowed,
    TransferAborted,
    Unavailable,
)
from arkvory.shared.metrics import Metrics

from . import basic_from_browsers
from .handle import HANDLE_KEY
from .refusals import REQUEST_ID_KEY

log = logging.getLogger("arkvory.http")
_CLIENT_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


def request_id(scope: Scope) -> str:
    return scope.get(REQUEST_ID_KEY, "-")


def error_body(code: str, message: str, rid: str) -> dict:
    return {"code": code, "message": message, "requestId": rid}


def error_response(scope: Scope, exc: ApiError) -> JSONResponse:
    response = JSONResponse(error_body(exc.code, exc.message, request_id(scope)), status_code=exc.status)
    for name, value in exc.header_pairs():
        response.headers.append(name, value)
    return response


# A refused request whose unread body is larger than this closes its connection, so that the
# server does not read and discard (say) 100 MB the client keeps sending.
_DISCARD_LIMIT = 64 * 1024


def _large_unread_body(scope: Scope) -> bool:
    length = _header(scope, b"content-length")
    if length is None:
        return _header(scope, b"transfer-encoding") is not None
    return not (length.isascii() and length.isdigit()) or len(length) > 9 or int(length) > _DISCARD_LIMIT


async def api_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    response = error_response(request.scope, exc)
    if _large_unread_body(request.scope):
        response.headers["Connection"] = "close"
    return response


_METHOD_ORDER = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves on this path (Starlette names only the first route's)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods.update(getattr(route, "methods", None) or ())
    return sorted(methods, key=lambda m: (_METHOD_ORDER.index(m) if m in _METHOD_ORDER else 99, m))


async def http_exception_handler(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 become the JSON error shape too."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        allow = allowed_methods(request)
        return await api_error_handler(
            request, MethodNotAllowed(f"{request.method} is not served here; try {', '.join(allow)}", allow)
        )
    code = {404: "not_found"}.get(exc.status_code, "invalid_input")
    message = {404: "no such route"}.get(exc.status_code, str(exc.detail))
    return JSONResponse(
        error_body(code, message, request_id(request.scope)),
        status_code=exc.status_code,
        headers=exc.headers,
    )


async def database_error_handler(request: Request, exc: Exception) -> Response:
    """A slow or unreachable database is a 503 the client may retry, never a 500."""
    log.warning("database problem in request %s: %s: %s", request_id(request.scope), exc.__class__.__name__, exc)
    if isinstance(exc, TimeoutError):
        return error_response(request.scope, Busy("the database did not answer in time", retry_after=1))
    return error_response(request.scope, Unavailable("the database cannot be reached"))


async def database_overload_handler(request: Request, exc: Exception) -> Response:
    """The server refused a connection (too many, starting, shutting down): retry later."""
    log.warning("database refused request %s: %s: %s", request_id(request.scope), exc.__class__.__name__, exc)
    return error_response(request.scope, Unavailable("the database is not accepting work now"))


async def constraint_conflict_handler(request: Request, exc: Exception) -> Response:
    """A row the request refers to vanished, or one it creates appeared, meanwhile (a race
    with another request): the client's request conflicts with the current state."""
    log.info("constraint conflict in request %s: %s", request_id(request.scope), exc)
    return await api_error_handler(
        request, Conflict("the request conflicts with a concurrent change; read the state and retry")
    )


async def data_error_handler(request: Request, exc: Exception) -> Response:
    """PostgreSQL refused a value the client sent (a check the routes missed): still the
    client's input, so 400, and logged so that the missing check gets added."""
    log.warning("database refused a value in request %s: %s: %s", request_id(request.scope), exc.__class__.__name__, exc)
    return await api_error_handler(request, InvalidInput("a value in the request is not acceptable"))


async def unexpected_error_handler(request: Request, exc: Exception) -> Response:
    if isinstance(exc, TransferAborted):
        # Cut on purpose after the response started; the content module logged why.
        return Response(status_code=500)
    log.exception("unexpected error in request %s", request_id(request.scope))
    return JSONResponse(
        error_body("internal", "internal error", request_id(request.scope)), status_code=500
    )


EXCEPTION_HANDLERS = {
    ApiError: api_error_handler,
    TimeoutError: database_error_handler,
    asyncpg.PostgresConnectionError: database_error_handler,
    asyncpg.InterfaceError: database_error_handler,
    ConnectionError: database_error_handler,
    asyncpg.InsufficientResourcesError: database_overload_handler,  # TooManyConnectionsError
    asyncpg.OperatorInterventionError: database_overload_handler,  # CannotConnectNowError, shutdown
    asyncpg.ForeignKeyViolationError: constraint_conflict_handler,
    asyncpg.UniqueViolationError: constraint_conflict_handler,
    asyncpg.DataError: data_error_handler,
    HTTPException: http_exception_handler,
    Exception: unexpected_error_handler,
}


async def send_error(scope: Scope, send: Send, exc: ApiError) -> None:
    """Answer from middleware, before any route or authentication ran."""
    body = json.dumps(error_body(exc.code, exc.message, request_id(scope))).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ] + [(k.lower().encode(), v.encode()) for k, v in exc.header_pairs()]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body if scope["method"] != "HEAD" else b""})


class RequestGuard:
    """Refuses requests whose credentials are ambiguous before any route reads them: with two
    `Authorization` headers, one part of the program could check one and another the other.
    And Basic credentials that a browser added to another site's request (basic_from_browsers.py)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = credentials_refusal(scope)
            if refused is not None:
                await send_error(scope, send, refused)
                return
        await self.app(scope, receive, send)


def credentials_refusal(scope: Scope) -> ApiError | None:
    """Why the request's credentials are refused before any route reads them, or None."""
    seen = 0
    authorization = b""
    for key, value in scope["headers"]:
        if key == b"authorization":
            seen += 1
            authorization = value
    if seen > 1:
        return InvalidInput("send at most one Authorization header")
    if seen and basic_from_browsers.is_basic(authorization):
        return basic_from_browsers.refusal(scope)
    return None


class RequestContext:
    """Gives each request an id, echoes it in `X-Request-Id`, and counts it in the metrics; and,
    outermost, ends quietly a request that its process's exit cancels.

    The counts go to the process's RequestCounts (shared/metrics.py) in one call: this runs
    for every request, small downloads included.

    `stopping` says whether the process is on its way out (its lease lost, a loop failed, a
    drain). Then the requests still running (waiting on the database, the store, a slow body)
    are cancelled by the exit itself: the server's shutdown past its grace (server.py), or the
    event loop's end after a loss, which does not wait for them. Such a cancellation is not an
    error of the request (uvicorn logged each as "Exception in ASGI application" with a
    traceback, below the one line that says why the process stops: issue 22 §13): it ends
    here, the connection reset.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics, stopping: Callable[[], bool] = lambda: False) -> None:
        self.app = app
        self.metrics = metrics
        self.stopping = stopping
        # Unique per process start and cheap: a random prefix and a counter (ids are not secrets).
        self._prefix = secrets.token_hex(6) + "-"
        self._numbers = itertools.count(1)
        self._requests = metrics.requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        offered = _header(scope, b"x-request-id")
        if offered and _CLIENT_REQUEST_ID.match(offered):
            rid = offered
        else:
            rid = self._prefix + "%x" % next(self._numbers)
        scope[REQUEST_ID_KEY] = rid
        started = time.perf_counter()
        send_with_id = _SendWithId(send, rid)
        # The content routes write their head through the connection handle (protocol.py),
        # past `send`: it records their status.
        handle = scope.get("extensions", {}).get(HANDLE_KEY)
        try:
            await self.app(scope, receive, send_with_id)
        except asyncio.CancelledError:
            if handle is None or not self.stopping():
                raise
            # The task ends with this request (the exit cancels it once): it may return. The
            # reset marks the exchange disconnected, so the server reports nothing either.
            handle.abort()
        finally:
            status = handle.status if handle is not None and handle.status else send_with_id.status
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope["method"]
            # Bounded: methods are parsed tokens, templates are the app's routes, statuses <
            # 1000; an unknown method is counted under one label so a client cannot grow them.
            if method not in _KNOWN_METHODS:
                method = "OTHER"
            self._requests.observe(method, template, status, time.perf_counter() - started)


class _SendWithId:
    """`send` that adds `X-Request-Id` to the response head and remembers its status, for the
    metrics (made for every request; the header is built only if a head goes through it)."""

    __slots__ = ("send", "request_id", "status")

    def __init__(self, send: Send, request_id: str) -> None:
        self.send = send
        self.request_id = request_id
        self.status = 500  # until a head is sent: an exception that escapes is a 500

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            message["headers"] = [*message.get("headers", []), (b"x-request-id", self.request_id.encode())]
        await self.send(message)


class RequestIds:
    """Only the request id of `RequestContext` (for a program without the serving metrics: the
    worker's health endpoints): every answer carries `X-Request-Id` and its error JSON the same
    `requestId`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        prefix = secrets.token_hex(6)
        self._ids = (f"{prefix}-{n:x}" for n in itertools.count(1))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        offered = _header(scope, b"x-request-id")
        rid = offered if offered and _CLIENT_REQUEST_ID.match(offered) else next(self._ids)
        scope[REQUEST_ID_KEY] = rid
        header = (b"x-request-id", rid.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        await self.app(scope, receive, send_with_id)


_KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None
