"""The three content routes every process serves (SPEC §6): one lookup, permission included,
decides the answer (a 304, an error, or a BlobResponse that streams the bytes: transfer.py), and
a fast path (ContentDispatch) takes these routes past Starlette's middleware stack.
"""

from __future__ import annotations

import base64
import urllib.parse
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.routing import Match, Route
from starlette.types import Message, Receive, Scope, Send

from arkvory.shared.auth.credentials import resolve, resolve_now
from arkvory.shared.auth.identity import Principal
from arkvory.shared.errors import InvalidInput, Unavailable
from arkvory.shared.http import basic_from_browsers
from arkvory.shared.http.access_log import PRINCIPAL_ID_KEY
from arkvory.shared.http.edge import EXCEPTION_HANDLERS, send_error
from arkvory.shared.http.handle import HANDLE_KEY, ConnectionHandle, encode_header_block
from arkvory.shared.http.query import checked_query
from arkvory.shared.http.ranges import not_modified, requested_range

from .catalog import (
    Artifact,
    ContentKey,
    Repository,
    by_artifact_id,
    by_asset,
    by_package,
    find_content,
    find_content_now,
    parse_uuid,
)
from .serving import ServingProcess
from .transfer import BlobResponse


def _sha256_b64(hex_digest: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_digest)).decode()


def content_disposition(name: str) -> str:
    ascii_name = name.encode("ascii", "replace").decode().replace('"', "'").replace("\\", "_")
    ascii_name = "".join(c if 32 <= ord(c) < 127 else "_" for c in ascii_name) or "download"
    quoted = urllib.parse.quote(name, safe="")
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quoted}"


class _Headers:
    """The response headers of one artifact as seen from one repository, encoded once: they
    depend only on the artifact (immutable) and on the repository being public."""

    __slots__ = ("etag", "common", "full", "full_block")

    def __init__(self, artifact: Artifact, public: bool) -> None:
        b64 = _sha256_b64(artifact.sha256)
        self.etag = f'"sha256:{artifact.sha256}"'
        cache_control = "public" if public else "private"
        self.common = (
            (b"etag", self.etag.encode()),
            (b"accept-ranges", b"bytes"),
            (b"digest", f"sha-256={b64}".encode()),
            (b"repr-digest", f"sha-256=:{b64}:".encode()),
            (b"cache-control", f"{cache_control}, max-age=0, must-revalidate".encode()),
        )
        self.full = (
            *self.common,
            (b"content-type", artifact.media_type.encode("latin-1")),
            (b"content-disposition", content_disposition(artifact.name).encode("latin-1")),
            (b"content-length", str(artifact.size).encode()),
        )
        self.full_block = encode_header_block(self.full)  # checked once, written per download


_HEADERS_CACHED = 4096
_headers_cache: dict[tuple[str, str, str, int, bool], _Headers] = {}


def _headers_of(artifact: Artifact, public: bool) -> _Headers:
    # Keyed by what the headers are made of (hashing the Artifact ran two Python `__hash__`
    # calls, its own and its id's, per download).
    key = (artifact.sha256, artifact.name, artifact.media_type, artifact.size, public)
    found = _headers_cache.get(key)
    if found is None:
        if len(_headers_cache) >= _HEADERS_CACHED:
            _headers_cache.clear()
        found = _headers_cache[key] = _Headers(artifact, public)
    return found


# The request headers a content answer depends on, and where _Ask keeps them.
_ASKED = {b"authorization": 0, b"range": 1, b"if-range": 2, b"if-none-match": 3}
_ASK_KEY = "arkvory.content_ask"


class _Ask:
    """What a content request says, read in one pass over its headers (this path runs once per
    download, small ones included, so it skips building a Starlette `Request`); the fast path
    (ContentDispatch) reads it once for its own check and hands it to the endpoint."""

    __slots__ = ("method", "repo", "authorization", "authorizations", "range", "if_range", "if_none_match")

    def __init__(self, scope: Scope) -> None:
        self.method = scope["method"]
        self.repo = scope["path_params"]["repo"]
        found: list[bytes | None] = [None, None, None, None]
        authorizations = 0
        for name, value in scope["headers"]:
            slot = _ASKED.get(name)
            if slot is not None:
                found[slot] = value  # the last one, as before; two Authorization are refused
                if not slot:
                    authorizations += 1
        self.authorizations = authorizations
        authorization, range_, if_range, if_none_match = found
        self.authorization = None if authorization is None else authorization.decode("latin-1")
        if range_ is None and if_range is None and if_none_match is None:  # the usual GET
            self.range = self.if_range = self.if_none_match = None
            return
        self.range = None if range_ is None else range_.decode("latin-1")
        self.if_range = None if if_range is None else if_range.decode("latin-1")
        self.if_none_match = None if if_none_match is None else if_none_match.decode("latin-1")


class _ContentEndpoint:
    """A content route as a plain ASGI app: Starlette's router calls it directly (no request
    wrapper); errors propagate to the app's exception handlers like any route's.

    Who asks and what they ask for come from memory when this process knows them (a plain
    call each); only what must ask the database is awaited, so that a small download is one
    coroutine here and two in its BlobResponse."""

    def __init__(self, key_of: Callable[[Scope], ContentKey]) -> None:
        self.key_of = key_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        runtime: ServingProcess = scope["app"].state.runtime
        key = self.key_of(scope)  # a malformed id or parameter is 400 whoever asks
        ask = scope.pop(_ASK_KEY, None) or _Ask(scope)
        # May this process serve? The dispatch (or the serving gate) asked just before this
        # call; it is asked again after every wait for the database, and once more after a
        # wait for a place (BlobResponse); the payload gate at the write has the last word.
        principal = resolve_now(runtime.keys, runtime.credentials, ask.authorization)
        if principal is None:  # a database credential this process does not remember (yet)
            principal = await resolve(runtime.keys, runtime.credentials, runtime.pool, ask.authorization)
            _still_serving(runtime)
        scope[PRINCIPAL_ID_KEY] = principal.id  # for the access line (access_log.note_principal)
        generation = runtime.catalog.generation
        found = find_content_now(runtime.catalog, ask.repo, principal, key)
        if found is None:
            assert runtime.pool is not None
            found = await find_content(runtime.pool, ask.repo, principal, key, runtime.catalog)
            _still_serving(runtime)
        response = _answer(runtime, ask, principal, key, found, generation)
        await response(scope, receive, send)


def _still_serving(runtime: ServingProcess) -> None:
    if not runtime.may_serve:
        raise Unavailable("this process cannot serve now (lease lost, schema too new or starting)")


class _Plain:
    """A body-less answer (304) with the given headers."""

    __slots__ = ("status", "headers")

    def __init__(self, status: int, headers: tuple[tuple[bytes, bytes], ...]) -> None:
        self.status = status
        self.headers = headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": b""})


async def _plan(runtime: ServingProcess, ask: _Ask, principal: Principal, key: ContentKey) -> Any:
    """Look the content up (permission checked) and decide the answer; no byte is sent here.
    (A transfer calls it again when the catalog changed while it waited for its place.)"""
    assert runtime.pool is not None
    generation = runtime.catalog.generation
    found = await find_content(runtime.pool, ask.repo, principal, key, runtime.catalog)
    return _answer(runtime, ask, principal, key, found, generation)


def _answer(
    runtime: ServingProcess,
    ask: _Ask,
    principal: Principal,
    key: ContentKey,
    found: tuple[Repository, Artifact],
    generation: int,
) -> Any:
    """The answer to `ask` for the content found (the catalog at `generation`): a 304, or a
    BlobResponse for the whole body or one range of it."""
    repo, artifact = found
    encoded = _headers_of(artifact, repo.public)
    etag = encoded.etag
    if ask.if_none_match is not None and not_modified(ask.if_none_match, etag):
        return _Plain(304, encoded.common)
    is_get = ask.method == "GET"
    # Range is defined for GET only (RFC 9110 §14.2): HEAD answers as GET without Range would.
    byte_range = None
    if is_get and ask.range is not None:
        byte_range = requested_range(ask.range, ask.if_range, etag, artifact.size)
    block = None
    if byte_range is None:
        status, headers, length, block = 200, encoded.full, artifact.size, encoded.full_block
    else:
        status, length = 206, byte_range.length
        headers = (
            *encoded.full[:-1],
            (b"content-length", str(length).encode()),
            (b"content-range", f"bytes {byte_range.start}-{byte_range.end}/{artifact.size}".encode()),
        )
    send_body = is_get and length > 0
    return BlobResponse(
        runtime,
        principal,
        artifact,
        status,
        headers,
        byte_range,
        send_body,
        generation,
        lambda: _plan(runtime, ask, principal, key),
        block,
    )


def _required(params: QueryParams, name: str) -> str:
    value = params.get(name)
    if not value:
        raise InvalidInput(f"query parameter {name!r} is required")
    return value


_ARTIFACT_KEYS_KEPT = 4096
_artifact_keys: dict[str, ContentKey] = {}


def _artifact_key(scope: Scope) -> ContentKey:
    # Parsing the UUID and building the key cost more than a dict lookup; only valid ids are
    # remembered, and the memo is bounded (cleared when full).
    if scope["query_string"]:
        checked_query(scope, QUERY_PARAMETERS[ARTIFACT_CONTENT], f"{scope['method']} {ARTIFACT_CONTENT}")
    text = scope["path_params"]["artifact_id"]
    key = _artifact_keys.get(text)
    if key is None:
        key = by_artifact_id(parse_uuid(text, "artifact id"))
        if len(_artifact_keys) >= _ARTIFACT_KEYS_KEPT:
            _artifact_keys.clear()
        _artifact_keys[text] = key
    return key


def _package_key(scope: Scope) -> ContentKey:
    params = checked_query(scope, QUERY_PARAMETERS[PACKAGE_CONTENT], f"{scope['method']} {PACKAGE_CONTENT}")
    group, name, version = (_required(params, p) for p in ("group", "name", "version"))
    return by_package(group, name, version)


def _asset_key(scope: Scope) -> ContentKey:
    params = checked_query(scope, QUERY_PARAMETERS[ASSET_CONTENT], f"{scope['method']} {ASSET_CONTENT}")
    return by_asset(_required(params, "path"))


ARTIFACT_CONTENT = "/api/v1/repositories/{repo}/artifacts/{artifact_id}/content"
PACKAGE_CONTENT = "/api/v1/repositories/{repo}/packages/content"
ASSET_CONTENT = "/api/v1/repositories/{repo}/asset/content"
# What each content route reads of its query (any other is 400, shared/http/query.py); the
# writer's OpenAPI document declares exactly these (writer/openapi.py).
QUERY_PARAMETERS: dict[str, frozenset[str]] = {
    ARTIFACT_CONTENT: frozenset(),
    PACKAGE_CONTENT: frozenset({"group", "name", "version"}),
    ASSET_CONTENT: frozenset({"path"}),
}
CONTENT_METHODS = ["GET", "HEAD"]
routes = [
    Route(
        ARTIFACT_CONTENT,
        _ContentEndpoint(_artifact_key),
        methods=CONTENT_METHODS,
        name="artifact_content",
    ),
    Route(
        PACKAGE_CONTENT,
        _ContentEndpoint(_package_key),
        methods=CONTENT_METHODS,
        name="package_content",
    ),
    Route(
        ASSET_CONTENT,
        _ContentEndpoint(_asset_key),
        methods=CONTENT_METHODS,
        name="asset_content",
    ),
]


class ContentDispatch:
    """The content routes' fast path, just inside the request-id and metrics layer: a GET or
    HEAD of one of the three content routes goes straight to its endpoint, past Starlette's
    middleware stack and router (five layers, each wrapping `send`), which cost more than a
    small download itself. Everything else goes to `app`.

    The fast path applies what the skipped layers would: a request with two `Authorization`
    headers, or with Basic credentials a browser added to another site's request, is refused
    (the gates' RequestGuard), a process that may not serve answers 503
    (ServingGate), and errors go through the same exception handlers.
    """

    def __init__(self, app: Starlette) -> None:
        self.app = app
        self.runtime: ServingProcess = app.state.runtime
        self._handlers = dict(EXCEPTION_HANDLERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = None
        if scope["type"] == "http" and scope["method"] in _READ and scope["path"].endswith("/content"):
            route = _matched_route(scope)
        if route is None:
            await self.app(scope, receive, send)
            return
        scope["app"] = self.app
        scope["route"] = route
        # One coroutine for the dispatch (this one) and one for the endpoint.
        ask = _Ask(scope)
        if ask.authorizations > 1:  # as edge.credentials_refusal, in the same pass
            await send_error(scope, send, InvalidInput("send at most one Authorization header"))
            return
        # basic_from_browsers.is_basic on the decoded value: another pass, for Basic only.
        if ask.authorization is not None and ask.authorization[:6].lower() == "basic ":
            refused = basic_from_browsers.refusal(scope)
            if refused is not None:
                await send_error(scope, send, refused)
                return
        scope[_ASK_KEY] = ask
        if not self.runtime.may_serve:
            await send_error(scope, send, Unavailable(f"this process cannot serve: {self.runtime.status}"))
            return
        handle: ConnectionHandle | None = scope.get("extensions", {}).get(HANDLE_KEY)
        if handle is None:  # another server: learn whether the response started by wrapping send
            send = _StartTracking(send)
        try:
            await route.app(scope, receive, send)
        except Exception as exc:
            handler = _handler_for(self._handlers, exc)
            started = handle.cycle.response_started if handle is not None else send.started
            if handler is None or started:
                raise
            response = await handler(Request(scope, receive), exc)
            await response(scope, receive, send)


# Paths of content requests matched so far, with their route and path parameters: matching
# is a pure function of the path, and Starlette's (a regex, two convertors, three dicts) costs
# more than a dict lookup on every download. Bounded in entries and in path length.
_MATCHES_KEPT = 4096
_MATCHED_PATH_MAX = 512
_matches: dict[tuple[str, str], tuple[Route, dict[str, Any]]] = {}


def _matched_route(scope: Scope) -> Route | None:
    """The content route that fully matches `scope` (GET or HEAD), with its endpoint and path
    parameters put into the scope as Starlette's `Route.matches` would; None for no match."""
    key = (scope.get("root_path", ""), scope["path"])
    found = _matches.get(key)
    if found is None:
        for route in routes:
            match, child = route.matches(scope)
            if match is Match.FULL:
                break
        else:
            return None
        # Only what the path itself gave (the scope's own parameters are added per request).
        found = (route, {name: child["path_params"][name] for name in route.param_convertors})
        if len(key[1]) <= _MATCHED_PATH_MAX:
            if len(_matches) >= _MATCHES_KEPT:
                _matches.clear()
            _matches[key] = found
    route, params = found
    scope["endpoint"] = route.endpoint
    scope["path_params"] = {**scope.get("path_params", {}), **params}
    return route


def _handler_for(handlers: dict, exc: Exception) -> Any:
    """The handler of the nearest class of `exc` that has one, as Starlette picks it."""
    for cls in type(exc).__mro__:
        if cls in handlers:
            return handlers[cls]
    return None


class _StartTracking:
    __slots__ = ("send", "started")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self.send(message)


_READ = frozenset({"GET", "HEAD"})
