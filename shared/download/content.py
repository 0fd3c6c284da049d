"""The three content routes every process serves (SPEC §6), and the streaming of blob bytes
through admission and the token buckets (SPEC §4).

Reads use `os.pread` on the event loop: blobs are read sequentially from the page cache, where a
64 KiB read costs microseconds, far less than a thread hop per chunk.

Cleanup runs while we serve (writer/maintenance/cleanup.py). A transfer pins its digest from the
lookup on and opens the blob only once the pin is committed (shared/cluster/pins.py says why that is
race-free); a blob found missing then means its artifact is gone (404) or its file is missing or
quarantined (503 `content_unavailable`), decided by the database, never a 500 or a partial body.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from starlette._exception_handler import _lookup_exception_handler
from starlette.applications import Starlette
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.routing import Match, Route
from starlette.types import Message, Receive, Scope, Send

from arkvory.shared.auth.credentials import resolve
from arkvory.shared.auth.identity import Principal
from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.errors import (
    ApiError,
    Busy,
    ContentUnavailable,
    InvalidInput,
    LeaseLost,
    NotFound,
    TransferAborted,
    Unavailable,
)
from arkvory.shared.http.edge import EXCEPTION_HANDLERS, ambiguous_credentials, error_response, send_error
from arkvory.shared.http.protocol import HANDLE_KEY, ConnectionHandle
from arkvory.shared.http.ranges import ByteRange, not_modified, requested_range

from .admission import AdmissionRejected
from .catalog import Artifact, ContentKey, by_artifact_id, by_asset, by_package, find_content, parse_uuid
from .serving import ServingProcess

log = logging.getLogger("arkvory.content")

_REJECTION_MESSAGES = {
    "full": "too many downloads are waiting on this process",
    "timed_out": "no download place became free in time",
    "draining": "this process is shutting down",
}
_LAST_BODY = {"type": "http.response.body", "body": b"", "more_body": False}
UNTHROTTLED_CHUNK = 1024 * 1024  # an unmetered transfer moves this much per write
# Below this a body is copied: headers and body then leave in one go, which beats a sendfile.
SENDFILE_MIN_BYTES = 64 * 1024
# When the socket is full, this much is copied into the transport to learn when it drains.
COPY_PIECE_BYTES = 16 * 1024


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

    __slots__ = ("etag", "common", "full")

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


_HEADERS_CACHED = 4096
_headers_cache: dict[tuple[Artifact, bool], _Headers] = {}


def _headers_of(artifact: Artifact, public: bool) -> _Headers:
    key = (artifact, public)
    found = _headers_cache.get(key)
    if found is None:
        if len(_headers_cache) >= _HEADERS_CACHED:
            _headers_cache.clear()
        found = _headers_cache[key] = _Headers(artifact, public)
    return found


class BlobResponse:
    """Streams one artifact (or one range of it) as an ASGI response.

    `replan` looks the content up again (permission included); it is called when the catalog
    changed while the transfer waited for its admission place, before any header is sent.
    """

    def __init__(
        self,
        runtime: ServingProcess,
        principal: Principal,
        artifact: Artifact,
        status_code: int,
        raw_headers: tuple[tuple[bytes, bytes], ...],
        byte_range: ByteRange | None,
        send_body: bool,
        generation: int = -1,
        replan: Callable[[], Awaitable[Any]] | None = None,
    ) -> None:
        self.status_code = status_code
        self.raw_headers = raw_headers
        self.runtime = runtime
        self.principal = principal
        self.artifact = artifact
        self.byte_range = byte_range
        self.send_body = send_body
        self.generation = generation
        self.replan = replan

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.send_body:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": b""})
            return
        handle: ConnectionHandle | None = scope.get("extensions", {}).get(HANDLE_KEY)
        # The transfer runs in this task and is cancelled if the client leaves while it waits
        # for a place, for tokens or for the socket. The protocol's handle says when the
        # connection is lost; without one (another server), a watcher task reads `receive`.
        guard = _CancelOnDisconnect(asyncio.current_task())
        watcher = None
        if handle is not None:
            handle.on_lost(guard.client_left)
        else:
            watcher = asyncio.create_task(_watch_disconnect(receive, guard))
        try:
            guard.armed = True
            try:
                await self._admitted_transfer(scope, send, handle)
            finally:
                guard.armed = False
        except asyncio.CancelledError:
            if guard.fired and guard.task.uncancel() == 0:
                # The client left while waiting or receiving; once payload flowed, an abort.
                if handle is not None and handle.cycle.response_started:
                    _client_gone(self.runtime, handle, "it closed the connection")
                return
            raise  # cancelled from outside (too)
        finally:
            if handle is not None:
                handle.on_lost(None)
            if watcher is not None:
                watcher.cancel()

    async def _admitted_transfer(
        self, scope: Scope, send: Send, handle: ConnectionHandle | None
    ) -> None:
        runtime = self.runtime
        try:
            # Pinned from the lookup on (in memory; shared/cluster/pins.py writes it while we queue),
            # so that the blob can be opened once the pin is visible to cleanup.
            with runtime.pins.hold(self.artifact.sha256):
                async with runtime.admission.admit(self.principal.id):
                    if not runtime.may_serve:
                        raise Unavailable("this process cannot serve now")
                    plan: Any = self
                    if self.replan is not None and runtime.catalog.generation != self.generation:
                        # The catalog changed while we waited: a repository may have become private,
                        # an asset may point elsewhere. No header is out yet, so answer afresh.
                        try:
                            plan = await self.replan()
                        except ApiError as exc:
                            plan = error_response(scope, exc)
                    if not isinstance(plan, BlobResponse):
                        await plan(scope, _no_receive, send)
                        return
                    if not plan.send_body:
                        await send({"type": "http.response.start", "status": plan.status_code, "headers": plan.raw_headers})
                        await send({"type": "http.response.body", "body": b""})
                        return
                    if plan.artifact.sha256 == self.artifact.sha256:
                        await plan._stream(send, handle)
                    else:
                        with runtime.pins.hold(plan.artifact.sha256):
                            await plan._stream(send, handle)
        except AdmissionRejected as exc:
            runtime.metrics.admission_failures.labels(reason=exc.reason).inc()
            busy = Busy(_REJECTION_MESSAGES.get(exc.reason, exc.reason), retry_after=exc.retry_after)
            await error_response(scope, busy)(scope, _no_receive, send)
        except (Unavailable, Busy, NotFound, ContentUnavailable) as exc:
            # Raised before the response started (opening the blob): an ordinary answer.
            await error_response(scope, exc)(scope, _no_receive, send)

    async def _stream(self, send: Send, handle: ConnectionHandle | None) -> None:
        runtime = self.runtime
        artifact = self.artifact
        start, length = (0, artifact.size) if self.byte_range is None else (
            self.byte_range.start,
            self.byte_range.length,
        )
        assert runtime.storage is not None
        blobs = runtime.storage.open_blobs
        if not runtime.pins.is_visible(artifact.sha256):
            try:
                await runtime.pins.until_visible(artifact.sha256)
            except TimeoutError:
                raise Unavailable("read pins cannot be written now; retry shortly") from None
        try:
            fd = blobs.acquire(artifact.sha256)
        except FileNotFoundError:
            fd = await self._open_after_missing()
        try:
            if length > SENDFILE_MIN_BYTES:  # a hint for read-ahead; one read needs none
                os.posix_fadvise(fd, start, length, os.POSIX_FADV_SEQUENTIAL)
            if handle is None:
                await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
                await self._send_through_asgi(fd, start, length, send)
                return
            aborter = _aborter(runtime, handle)
            runtime.transfers.add(aborter)
            try:
                timeout = runtime.settings.send_timeout_s
                if not await handle.writable(timeout):
                    self._send_timed_out(handle)
                    return
                if length <= SENDFILE_MIN_BYTES:
                    handle.hold_head()  # head and body leave in one write
                try:
                    await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
                    done = await Payload(runtime, self, handle, fd).send(start, length)
                finally:
                    handle.release_head()
                if done:
                    # Straight to uvicorn: the middlewares' wrappers only look at the start.
                    await handle.cycle.send(_LAST_BODY)
            finally:
                runtime.transfers.discard(aborter)
        finally:
            blobs.release(artifact.sha256, fd)

    async def _open_after_missing(self) -> int:
        """The blob was not there although our pin was visible: cleanup removed it before it
        could see the pin, which it does only for a blob no artifact referenced at its check.
        So ask the database (not the cache) whether the artifact still exists: gone → 404; if
        it does, one more open (an upload of the same bytes may have placed the file again),
        and then 503 content_unavailable (missing or quarantined on disk), never a 500."""
        runtime, artifact = self.runtime, self.artifact
        assert runtime.pool is not None and runtime.storage is not None
        try:
            async with pooled(runtime.pool) as conn:
                exists = await conn.fetchval(
                    "SELECT EXISTS (SELECT 1 FROM arkvory_artifacts WHERE id = $1)",
                    artifact.id, timeout=POOLED_QUERY_TIMEOUT_S,
                )
        except TimeoutError:
            raise Busy("no database connection became free in time") from None
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            raise Unavailable("the database cannot be reached now") from None
        if not exists:
            raise NotFound(f"artifact {artifact.id} was deleted")
        try:
            return runtime.storage.open_blobs.acquire(artifact.sha256)
        except FileNotFoundError:
            runtime.metrics.short_reads.inc()
            log.error("blob %s of artifact %s is missing from storage", artifact.sha256, artifact.id)
            raise ContentUnavailable(
                "the artifact's stored content is missing or quarantined; re-uploading it restores it"
            ) from None

    def _send_timed_out(self, handle: ConnectionHandle) -> None:
        self.runtime.metrics.transfer_aborts.labels(direction="download", reason="send_timeout").inc()
        log.info(
            "download of %s aborted: the client took no byte for %d s",
            self.artifact.sha256,
            self.runtime.settings.send_timeout_s,
        )
        handle.abort()

    def _short_read(self) -> TransferAborted:
        self.runtime.metrics.short_reads.inc()
        self.runtime.metrics.transfer_aborts.labels(direction="download", reason="short_read").inc()
        log.error(
            "blob %s is shorter on disk than its metadata (%d bytes): aborting the response",
            self.artifact.sha256,
            self.artifact.size,
        )
        return TransferAborted("blob shorter than its metadata")

    async def _send_through_asgi(self, fd: int, offset: int, remaining: int, send: Send) -> None:
        """Copying path through the ASGI `send` (no protocol handle: not our server)."""
        runtime = self.runtime
        bandwidth = runtime.bandwidth
        chunk = UNTHROTTLED_CHUNK if bandwidth.unlimited else bandwidth.quantum_bytes
        while remaining:
            try:
                size = await bandwidth.grant(self.principal.id, min(remaining, chunk))
            except LeaseLost as exc:
                raise TransferAborted(f"lease lost: {exc}") from None
            if not _payload_may_flow(runtime):
                raise TransferAborted("lease no longer trusted")
            data = os.pread(fd, size, offset)
            if len(data) != size:
                raise self._short_read()
            offset += size
            remaining -= size
            await send({"type": "http.response.body", "body": data, "more_body": remaining > 0})
            runtime.metrics.payload_bytes.inc(size)


class Payload:
    """The body of one download, written straight to its connection.

    Before every write: tokens from both buckets, the socket able to take more within the send
    timeout, and the lease still trusted. On plain TCP the bytes go with `os.sendfile` from the
    page cache to the socket (uvloop has no `loop.sendfile`); when the socket is full, one copied
    piece is handed to the transport, whose flow control then says when it has left. With the
    transport's write-buffer limits at zero "writable" means "nothing queued", so a sendfile
    never overtakes queued bytes. TLS, and small bodies, take the copying path.
    """

    __slots__ = ("runtime", "response", "handle", "fd")

    def __init__(self, runtime: ServingProcess, response: BlobResponse, handle: ConnectionHandle, fd: int) -> None:
        self.runtime = runtime
        self.response = response
        self.handle = handle
        self.fd = fd

    async def send(self, offset: int, remaining: int) -> bool:
        """True when every byte was handed over; False when the connection is gone or was cut."""
        runtime, handle, fd = self.runtime, self.handle, self.fd
        bandwidth = runtime.bandwidth
        principal_id = self.response.principal.id
        timeout = runtime.settings.send_timeout_s
        payload = runtime.metrics.payload_bytes
        chunk = UNTHROTTLED_CHUNK if bandwidth.unlimited else bandwidth.quantum_bytes
        zero_copy = handle.can_sendfile and remaining > SENDFILE_MIN_BYTES
        if zero_copy:
            handle.transport.set_write_buffer_limits(high=0, low=0)
        granted = 0  # passed the buckets, not yet handed over (a partial sendfile keeps the rest)
        while remaining:
            if not granted:
                try:
                    granted = await bandwidth.grant(principal_id, min(remaining, chunk))
                except LeaseLost:
                    self._cut_for_lease()  # usually done already by the registry's abort_all
                    return False
            if not await handle.writable(timeout):
                self.response._send_timed_out(handle)
                return False
            if handle.lost:
                _client_gone(runtime, handle, "it closed the connection")
                return False
            if not _payload_may_flow(runtime):
                self._cut_for_lease()
                return False
            sent = 0
            if zero_copy and not handle.buffered:
                try:
                    sent = handle.sendfile(fd, offset, granted)
                except EOFError:
                    raise self.response._short_read() from None
                except ConnectionError as exc:  # broken pipe, reset
                    _client_gone(runtime, handle, f"{exc.__class__.__name__}: {exc}")
                    return False
            if not sent:
                size = granted if not zero_copy else min(granted, COPY_PIECE_BYTES)
                data = os.pread(fd, size, offset)
                if len(data) != size:
                    raise self.response._short_read()
                handle.write(data)
                sent = size
            offset += sent
            remaining -= sent
            granted -= sent
            payload.inc(sent)
        if not await handle.writable(timeout):
            self.response._send_timed_out(handle)
            return False
        if handle.lost:
            _client_gone(runtime, handle, "it closed the connection")
            return False
        return True

    def _cut_for_lease(self) -> None:
        if not self.handle.lost:
            self.runtime.metrics.transfer_aborts.labels(direction="download", reason="lease_lost").inc()
            self.handle.abort()


def _payload_may_flow(runtime: ServingProcess) -> bool:
    return runtime.payload_allowed()


def _client_gone(runtime: ServingProcess, handle: ConnectionHandle, why: str) -> None:
    """The client left in the middle of its download (a reset, a broken pipe, a close): an
    abort like the server's own cuts, counted once per transfer, and not an error of ours, so
    it is logged at debug only."""
    handle.cycle.disconnected = True  # uvicorn then reports no unfinished response
    if handle.cut:
        return  # the server had cut it already (and counted why)
    handle.cut = True
    runtime.metrics.transfer_aborts.labels(direction="download", reason="client_gone").inc()
    log.debug("download aborted: the client left (%s)", why)


def _aborter(runtime: ServingProcess, handle: ConnectionHandle) -> Callable[[str], None]:
    def abort(reason: str) -> None:
        runtime.metrics.transfer_aborts.labels(direction="download", reason=reason).inc()
        handle.abort()

    return abort


class _CancelOnDisconnect:
    """Cancels the request's task when the client leaves, but only while the transfer runs
    (`armed`): a cancellation must never land after the transfer has returned."""

    __slots__ = ("task", "armed", "fired")

    def __init__(self, task: asyncio.Task | None) -> None:
        assert task is not None
        self.task = task
        self.armed = False
        self.fired = False

    def client_left(self) -> None:
        if self.armed and not self.fired:
            self.fired = True
            self.task.cancel()


async def _watch_disconnect(receive: Receive, guard: _CancelOnDisconnect) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            guard.client_left()
            return


async def _no_receive() -> dict:
    return {"type": "http.disconnect"}


class _Ask:
    """What a content request says, read in one pass over its headers (this path runs once per
    download, small ones included, so it skips building a Starlette `Request`)."""

    __slots__ = ("method", "repo", "authorization", "range", "if_range", "if_none_match")

    def __init__(self, scope: Scope) -> None:
        self.method = scope["method"]
        self.repo = scope["path_params"]["repo"]
        authorization = range_ = if_range = if_none_match = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"range":
                range_ = value.decode("latin-1")
            elif name == b"if-range":
                if_range = value.decode("latin-1")
            elif name == b"if-none-match":
                if_none_match = value.decode("latin-1")
        self.authorization = authorization
        self.range = range_
        self.if_range = if_range
        self.if_none_match = if_none_match


class _ContentEndpoint:
    """A content route as a plain ASGI app: Starlette's router calls it directly (no request
    wrapper); errors propagate to the app's exception handlers like any route's."""

    def __init__(self, key_of: Callable[[Scope], ContentKey]) -> None:
        self.key_of = key_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        runtime: ServingProcess = scope["app"].state.runtime
        key = self.key_of(scope)  # a malformed id or parameter is 400 whoever asks
        ask = _Ask(scope)
        principal = await resolve(runtime.keys, runtime.credentials, runtime.pool, ask.authorization)
        if not runtime.may_serve:
            raise Unavailable("this process cannot serve now (lease lost, schema too new or starting)")
        response = await _plan(runtime, ask, principal, key)
        await response(scope, receive, send)


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
    """Look the content up (permission checked) and decide the answer; no byte is sent here."""
    assert runtime.pool is not None
    generation = runtime.catalog.generation
    repo, artifact = await find_content(
        runtime.pool, ask.repo, principal, key, runtime.catalog
    )
    encoded = _headers_of(artifact, repo.public)
    etag = encoded.etag
    if not_modified(ask.if_none_match, etag):
        return _Plain(304, encoded.common)
    is_get = ask.method == "GET"
    # Range is defined for GET only (RFC 9110 §14.2): HEAD answers as GET without Range would.
    byte_range = requested_range(ask.range, ask.if_range, etag, artifact.size) if is_get else None
    if byte_range is None:
        status, headers, length = 200, encoded.full, artifact.size
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
    text = scope["path_params"]["artifact_id"]
    key = _artifact_keys.get(text)
    if key is None:
        key = by_artifact_id(parse_uuid(text, "artifact id"))
        if len(_artifact_keys) >= _ARTIFACT_KEYS_KEPT:
            _artifact_keys.clear()
        _artifact_keys[text] = key
    return key


def _package_key(scope: Scope) -> ContentKey:
    params = QueryParams(scope["query_string"])
    group, name, version = (_required(params, p) for p in ("group", "name", "version"))
    return by_package(group, name, version)


def _asset_key(scope: Scope) -> ContentKey:
    return by_asset(_required(QueryParams(scope["query_string"]), "path"))


CONTENT_METHODS = ["GET", "HEAD"]
routes = [
    Route(
        "/api/v1/repositories/{repo}/artifacts/{artifact_id}/content",
        _ContentEndpoint(_artifact_key),
        methods=CONTENT_METHODS,
        name="artifact_content",
    ),
    Route(
        "/api/v1/repositories/{repo}/packages/content",
        _ContentEndpoint(_package_key),
        methods=CONTENT_METHODS,
        name="package_content",
    ),
    Route(
        "/api/v1/repositories/{repo}/asset/content",
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
    headers is refused (the gates' RequestGuard), a process that may not serve answers 503
    (ServingGate), and errors go through the same exception handlers.
    """

    def __init__(self, app: Starlette) -> None:
        self.app = app
        self.runtime: ServingProcess = app.state.runtime
        self._handlers = dict(EXCEPTION_HANDLERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in _READ and scope["path"].endswith("/content"):
            for route in routes:
                match, child = route.matches(scope)
                if match is Match.FULL:
                    scope.update(child)
                    scope["app"] = self.app
                    scope["route"] = route
                    await self._call(route, scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _call(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        if ambiguous_credentials(scope):
            await send_error(scope, send, InvalidInput("send at most one Authorization header"))
            return
        if not self.runtime.may_serve:
            await send_error(scope, send, Unavailable(f"this process cannot serve: {self.runtime.status}"))
            return
        handle: ConnectionHandle | None = scope.get("extensions", {}).get(HANDLE_KEY)
        if handle is None:  # another server: learn whether the response started by wrapping send
            send = _StartTracking(send)
        try:
            await route.app(scope, receive, send)
        except Exception as exc:
            handler = _lookup_exception_handler(self._handlers, exc)
            started = handle.cycle.response_started if handle is not None else send.started
            if handler is None or started:
                raise
            response = await handler(Request(scope, receive), exc)
            await response(scope, receive, send)


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
