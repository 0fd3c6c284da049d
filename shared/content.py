"""The three content routes every process serves (SPEC §6), and the streaming of blob bytes
through admission and the token buckets (SPEC §4).

Reads use `os.pread` on the event loop: blobs are read sequentially from the page cache, where a
64 KiB read costs microseconds, far less than a thread hop per chunk.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import urllib.parse

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from .admission import AdmissionRejected
from .catalog import (
    Artifact,
    ContentKey,
    by_artifact_id,
    by_asset,
    by_package,
    find_content,
    parse_uuid,
)
from .errors import Busy, InvalidInput, LeaseLost, TransferAborted, Unavailable
from .http import error_response
from .identity import Principal, authenticate
from .ranges import ByteRange, not_modified, requested_range
from .runtime import Runtime

log = logging.getLogger("arkvory.content")

_REJECTION_MESSAGES = {
    "full": "too many downloads are waiting on this process",
    "timed_out": "no download place became free in time",
    "draining": "this process is shutting down",
}
UNTHROTTLED_CHUNK = 1024 * 1024
THROTTLED_CHUNK = 64 * 1024


def _sha256_b64(hex_digest: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_digest)).decode()


def content_disposition(name: str) -> str:
    ascii_name = name.encode("ascii", "replace").decode().replace('"', "'").replace("\\", "_")
    ascii_name = "".join(c if 32 <= ord(c) < 127 else "_" for c in ascii_name) or "download"
    quoted = urllib.parse.quote(name, safe="")
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quoted}"


class BlobResponse(Response):
    """Streams one artifact (or one range of it) as an ASGI response."""

    def __init__(
        self,
        runtime: Runtime,
        principal: Principal,
        artifact: Artifact,
        status_code: int,
        headers: dict[str, str],
        byte_range: ByteRange | None,
        send_body: bool,
    ) -> None:
        super().__init__(status_code=status_code, headers=headers)
        self.runtime = runtime
        self.principal = principal
        self.artifact = artifact
        self.byte_range = byte_range
        self.send_body = send_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.send_body:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": b""})
            return
        # The transfer runs in this task; a watcher cancels it if the client leaves while it waits
        # for a place, for tokens or for the socket. (One task per request instead of two and an
        # `asyncio.wait`: this path runs once per download, small ones included.)
        disconnected = asyncio.Event()
        guard = _CancelOnDisconnect(asyncio.current_task())
        watcher = asyncio.create_task(_watch_disconnect(receive, disconnected, guard))
        try:
            guard.armed = True
            try:
                await self._admitted_transfer(scope, send, disconnected)
            finally:
                guard.armed = False
        except asyncio.CancelledError:
            if guard.fired and guard.task.uncancel() == 0:
                return  # the client left while waiting or receiving
            raise  # cancelled from outside (too)
        finally:
            watcher.cancel()

    async def _admitted_transfer(self, scope: Scope, send: Send, disconnected: asyncio.Event) -> None:
        runtime = self.runtime
        try:
            async with runtime.admission.admit(self.principal.id):
                if not runtime.may_serve:
                    raise Unavailable("this process cannot serve now")
                with runtime.pins.hold(self.artifact.sha256):
                    await self._stream(send, disconnected)
        except AdmissionRejected as exc:
            runtime.metrics.admission_failures.labels(reason=exc.reason).inc()
            busy = Busy(_REJECTION_MESSAGES.get(exc.reason, exc.reason), retry_after=exc.retry_after)
            await error_response(scope, busy)(scope, _no_receive, send)
        except Unavailable as exc:
            await error_response(scope, exc)(scope, _no_receive, send)

    async def _stream(self, send: Send, disconnected: asyncio.Event) -> None:
        runtime = self.runtime
        artifact = self.artifact
        start, length = (0, artifact.size) if self.byte_range is None else (
            self.byte_range.start,
            self.byte_range.length,
        )
        assert runtime.storage is not None
        path = runtime.storage.blob_file(artifact.sha256)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            runtime.metrics.short_reads.inc()
            log.error("blob %s of artifact %s is missing from storage", artifact.sha256, artifact.id)
            raise Unavailable("the artifact's content is missing from storage") from None
        try:
            if length > THROTTLED_CHUNK:  # a hint for read-ahead; one read needs none
                os.posix_fadvise(fd, start, length, os.POSIX_FADV_SEQUENTIAL)
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            await self._send_bytes(fd, start, length, send, disconnected)
        finally:
            os.close(fd)

    async def _send_bytes(
        self, fd: int, offset: int, remaining: int, send: Send, disconnected: asyncio.Event
    ) -> None:
        runtime = self.runtime
        bandwidth = runtime.bandwidth
        lease = runtime.lease
        payload = runtime.metrics.payload_bytes
        # Metered transfers move one quantum per grant; an unmetered one reads 1 MiB at a time.
        chunk = UNTHROTTLED_CHUNK if bandwidth.unlimited else THROTTLED_CHUNK
        principal_id = self.principal.id
        while remaining:
            if disconnected.is_set():
                return
            try:
                size = await bandwidth.grant(principal_id, min(remaining, chunk))
            except LeaseLost as exc:
                raise TransferAborted(f"lease lost: {exc}") from None
            if lease is not None and not lease.trusted:
                raise TransferAborted("lease no longer trusted")
            data = os.pread(fd, size, offset)
            if len(data) != size:
                runtime.metrics.short_reads.inc()
                log.error(
                    "blob %s is shorter on disk than its metadata (%d bytes): aborting the response",
                    self.artifact.sha256,
                    self.artifact.size,
                )
                raise TransferAborted("blob shorter than its metadata")
            offset += size
            remaining -= size
            await send({"type": "http.response.body", "body": data, "more_body": remaining > 0})
            payload.inc(size)


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


async def _watch_disconnect(
    receive: Receive, disconnected: asyncio.Event, guard: _CancelOnDisconnect
) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            disconnected.set()
            guard.client_left()
            return


async def _no_receive() -> dict:
    return {"type": "http.disconnect"}


async def _serve(request: Request, key: ContentKey) -> Response:
    runtime: Runtime = request.app.state.runtime
    principal = authenticate(runtime.keys, request.headers.get("authorization"))
    if not runtime.may_serve:
        raise Unavailable("this process cannot serve now (lease lost, schema too new or starting)")
    assert runtime.pool is not None
    repo, artifact = await find_content(
        runtime.pool, request.path_params["repo"], principal, key, runtime.catalog
    )
    etag = f'"sha256:{artifact.sha256}"'
    headers = {
        "ETag": etag,
        "Accept-Ranges": "bytes",
        "Digest": f"sha-256={_sha256_b64(artifact.sha256)}",
        "Repr-Digest": f"sha-256=:{_sha256_b64(artifact.sha256)}:",
        "Cache-Control": "public, max-age=0, must-revalidate" if repo.public else "private, max-age=0, must-revalidate",
    }
    if not_modified(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    byte_range = requested_range(
        request.headers.get("range"), request.headers.get("if-range"), etag, artifact.size
    )
    headers["Content-Type"] = artifact.media_type
    headers["Content-Disposition"] = content_disposition(artifact.name)
    if byte_range is None:
        status, headers["Content-Length"] = 200, str(artifact.size)
    else:
        status, headers["Content-Length"] = 206, str(byte_range.length)
        headers["Content-Range"] = f"bytes {byte_range.start}-{byte_range.end}/{artifact.size}"
    send_body = request.method == "GET" and int(headers["Content-Length"]) > 0
    return BlobResponse(runtime, principal, artifact, status, headers, byte_range, send_body)


def _required(request: Request, name: str) -> str:
    value = request.query_params.get(name)
    if not value:
        raise InvalidInput(f"query parameter {name!r} is required")
    return value


async def artifact_content(request: Request) -> Response:
    artifact_id = parse_uuid(request.path_params["artifact_id"], "artifact id")
    return await _serve(request, by_artifact_id(artifact_id))


async def package_content(request: Request) -> Response:
    group, name, version = (_required(request, p) for p in ("group", "name", "version"))
    return await _serve(request, by_package(group, name, version))


async def asset_content(request: Request) -> Response:
    path = _required(request, "path")
    return await _serve(request, by_asset(path))


CONTENT_METHODS = ["GET", "HEAD"]
routes = [
    Route(
        "/api/v1/repositories/{repo}/artifacts/{artifact_id}/content",
        artifact_content,
        methods=CONTENT_METHODS,
    ),
    Route("/api/v1/repositories/{repo}/packages/content", package_content, methods=CONTENT_METHODS),
    Route("/api/v1/repositories/{repo}/asset/content", asset_content, methods=CONTENT_METHODS),
]
