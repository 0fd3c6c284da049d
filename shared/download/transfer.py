"""The streaming of one download's blob bytes through admission and the token buckets (SPEC §4),
for the content routes (content.py), which decide what to send; the body itself is written by
payload.py (a small one in one synchronous step here, `BlobResponse._send_at_once`).

Reads use `os.pread` on the event loop: blobs are read sequentially from the page cache, where a
64 KiB read costs microseconds, far less than a thread hop per chunk.

Cleanup runs while we serve (writer/maintenance/cleanup.py). A transfer pins its digest from the
lookup on and opens the blob only once the pin is committed (shared/cluster/pins.py says why that
is race-free); a blob found missing then means its artifact is gone (404) or its file is missing
or quarantined (503 `content_unavailable`), decided by the database, never a 500 or a partial
body.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.types import Receive, Scope, Send

from arkvory.shared.auth.identity import Principal
from arkvory.shared.errors import (
    ApiError,
    Busy,
    ContentUnavailable,
    LeaseLost,
    NotFound,
    TransferAborted,
    Unavailable,
)
from arkvory.shared.http.edge import REQUEST_ID_KEY, error_response
from arkvory.shared.http.protocol import HANDLE_KEY, ConnectionHandle, PayloadRefused, encode_header_block
from arkvory.shared.http.ranges import ByteRange

from .admission import AdmissionRejected
from .catalog import Artifact, require_artifact
from .object_transfer import stream_from_store
from .payload import (
    SENDFILE_MIN_BYTES,
    UNTHROTTLED_CHUNK,
    Payload,
    _client_gone,
    _cut_for_lease,
)
from .serving import ServingProcess

log = logging.getLogger("arkvory.content")

_REJECTION_MESSAGES = {
    "full": "too many downloads are waiting on this process",
    "timed_out": "no download place became free in time",
    "draining": "this process is shutting down",
}

class BlobResponse:
    """Streams one artifact (or one range of it) as an ASGI response.

    `replan` looks the content up again (permission included); it is called when the catalog
    changed while the transfer waited for its admission place, before any header is sent.
    `header_block` is `raw_headers` encoded for `ConnectionHandle.start` (content.py keeps it
    per artifact); None to encode them here.
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
        header_block: bytes | None = None,
    ) -> None:
        self.status_code = status_code
        self.raw_headers = raw_headers
        self.header_block = header_block
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
        runtime = self.runtime
        handle: ConnectionHandle | None = scope.get("extensions", {}).get(HANDLE_KEY)
        # The transfer runs in this task and is cancelled if the client leaves while it waits
        # for a place, its pin, tokens or the socket: the guard is armed before the first wait.
        guard = _CancelOnDisconnect(handle, receive)
        pins, sha256 = runtime.pins, self.artifact.sha256
        try:
            try:
                # Pinned from the lookup on (in memory; shared/cluster/pins.py writes it while we
                # queue), so that the blob can be opened once the pin is visible to cleanup.
                # (`pins.hold` and `admission.admit` as plain calls: no context manager per download.)
                pins.take(sha256)
                try:
                    # A place, taken without a coroutine when one is free (the usual case).
                    admission, principal_id = runtime.admission, self.principal.id
                    waited = not admission.try_enter(principal_id)
                    if waited:
                        guard.arm()
                        await admission.enter(principal_id)
                    try:
                        # Whether this process may serve was asked when the request arrived and
                        # after every wait for the database (content.py): again if this waited.
                        if waited and not runtime.may_serve:
                            raise Unavailable("this process cannot serve now")
                        if self.replan is None or runtime.catalog.generation == self.generation:
                            await self._stream(scope, send, handle, guard)
                        else:
                            await self._stream_replanned(scope, send, handle, guard)
                    finally:
                        admission.leave(principal_id)
                finally:
                    pins.give_back(sha256)
            except AdmissionRejected as exc:
                runtime.metrics.admission_failures.labels(reason=exc.reason).inc()
                busy = Busy(_REJECTION_MESSAGES.get(exc.reason, exc.reason), retry_after=exc.retry_after)
                await error_response(scope, busy)(scope, _no_receive, send)
            except (Unavailable, Busy, NotFound, ContentUnavailable) as exc:
                # Raised before the response started (opening the blob): an ordinary answer.
                await error_response(scope, exc)(scope, _no_receive, send)
        except asyncio.CancelledError:
            if guard.fired and guard.task is not None and guard.task.uncancel() == 0:
                # The client left while waiting or receiving; once payload flowed, an abort.
                if handle is not None and handle.cycle.response_started:
                    _client_gone(runtime, handle, "it closed the connection")
                return
            raise  # cancelled from outside (too)
        finally:
            guard.disarm()

    async def _stream_replanned(
        self, scope: Scope, send: Send, handle: ConnectionHandle | None, guard: _CancelOnDisconnect
    ) -> None:
        """The catalog changed while the transfer waited for its place (a repository may have
        become private, an asset may point elsewhere): no header is out yet, so look the content
        up again (permission included) and answer afresh."""
        runtime = self.runtime
        guard.arm()
        try:
            plan = await self.replan()
        except ApiError as exc:
            plan = error_response(scope, exc)
        if not runtime.may_serve:  # asked again after the wait for the database
            raise Unavailable("this process cannot serve now")
        if not isinstance(plan, BlobResponse):
            await plan(scope, _no_receive, send)
        elif not plan.send_body:
            await send({"type": "http.response.start", "status": plan.status_code, "headers": plan.raw_headers})
            await send({"type": "http.response.body", "body": b""})
        elif plan.artifact.sha256 == self.artifact.sha256:
            await plan._stream(scope, send, handle, guard)
        else:
            with runtime.pins.hold(plan.artifact.sha256):
                await plan._stream(scope, send, handle, guard)

    async def _stream(
        self, scope: Scope, send: Send, handle: ConnectionHandle | None, guard: _CancelOnDisconnect
    ) -> None:
        runtime = self.runtime
        artifact = self.artifact
        start, length = (0, artifact.size) if self.byte_range is None else (
            self.byte_range.start,
            self.byte_range.length,
        )
        storage = runtime.storage
        assert storage is not None
        if not runtime.pins.is_visible(artifact.sha256):
            guard.arm()
            try:
                await runtime.pins.until_visible(artifact.sha256)
            except TimeoutError:
                raise Unavailable("read pins cannot be written now; retry shortly") from None
        try:
            fd = storage.acquire_file(artifact.sha256)
        except FileNotFoundError:
            guard.arm()
            fd = await self._open_after_missing()
        if fd is None:  # not a local file (an object store): streamed in segments from there
            guard.arm()
            await stream_from_store(self, send, handle, start, length)
            return
        try:
            if length > SENDFILE_MIN_BYTES:  # a hint for read-ahead; one read needs none
                os.posix_fadvise(fd, start, length, os.POSIX_FADV_SEQUENTIAL)
            if handle is None:
                guard.arm()
                await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
                await self._send_through_asgi(fd, start, length, send)
                return
            head = self.header_block
            if head is None:
                head = encode_header_block(self.raw_headers)
            request_id = scope.get(REQUEST_ID_KEY)
            extra = b"x-request-id: " + request_id.encode() + b"\r\n" if request_id else b""
            if length <= SENDFILE_MIN_BYTES:
                done = self._send_at_once(handle, fd, head, extra, start, length)
                if done is None:  # it has to wait (tokens, the socket): the general path
                    guard.arm()
                    done = await Payload(runtime, self, handle, fd).send(
                        start, length, head=(self.status_code, head, length, extra)
                    )
                elif done and (handle.cycle.flow.write_paused or handle.lost):
                    guard.arm()
                    done = await Payload(runtime, self, handle, fd).flushed()
            else:
                guard.arm()
                done = await Payload(runtime, self, handle, fd).send(
                    start, length, head=(self.status_code, head, length, extra)
                )
            if done:
                handle.complete()
        finally:
            storage.release_file(artifact.sha256, fd)

    def _send_at_once(
        self, handle: ConnectionHandle, fd: int, head: bytes, extra: bytes, offset: int, length: int
    ) -> bool | None:
        """A small body (≤ SENDFILE_MIN_BYTES) with its head in one write, when nothing has to
        wait: the socket takes more and the buckets hold all its tokens now. True when it was
        handed over, False when it was cut (the payload gate said no at the write); None when
        it has to wait, with nothing taken or written: then `Payload.send`, the general path,
        does it. The checks are the general path's own calls (`grant_now`, the gate inside
        `ConnectionHandle.start`); only the coroutine, the Payload and the registration that
        waiting needs are skipped (issue 14 §3)."""
        bandwidth = self.runtime.bandwidth
        if handle.cycle.flow.write_paused or handle.lost or length > bandwidth.quantum_bytes:
            return None  # (a grant never exceeds the quantum: the general path takes turns)
        try:
            if not bandwidth.grant_now(self.principal.id, length):
                return None
        except LeaseLost:
            _cut_for_lease(self.runtime, handle)
            return False
        data = os.pread(fd, length, offset)
        if len(data) != length:
            raise self._short_read()
        try:
            handle.start(self.status_code, head, length, extra, data)
        except PayloadRefused:
            _cut_for_lease(self.runtime, handle)
            return False
        self.runtime.metrics.payload_bytes.inc(length)
        return True

    async def _open_after_missing(self) -> int:
        """The blob was not there although our pin was visible: cleanup removed it before it
        could see the pin, which it does only for a blob no artifact referenced at its check.
        So ask the database (not the cache) whether the artifact still exists: gone → 404; if
        it does, one more open (an upload of the same bytes may have placed the file again),
        and then 503 content_unavailable (missing or quarantined on disk), never a 500."""
        runtime, artifact = self.runtime, self.artifact
        assert runtime.storage is not None
        await require_artifact(runtime.pool, artifact.id)
        try:
            return runtime.storage.acquire_file(artifact.sha256)
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


def _payload_may_flow(runtime: ServingProcess) -> bool:
    return runtime.payload_allowed()


class _CancelOnDisconnect:
    """Cancels the request's task when the client leaves while the transfer waits (a place, its
    pin, tokens, the socket), never after the transfer has returned.

    Armed (`arm`) before the transfer's first wait, not at its start: the client's leaving is
    seen only between awaits, so a transfer that never waits (a small download) needs no
    task, no callback and no watcher. The protocol's handle says when the connection is
    lost; without one (another server), a watcher task reads `receive`."""

    __slots__ = ("handle", "receive", "task", "armed", "fired", "watcher")

    def __init__(self, handle: ConnectionHandle | None, receive: Receive) -> None:
        self.handle = handle
        self.receive = receive
        self.task: asyncio.Task | None = None
        self.armed = False
        self.fired = False
        self.watcher: asyncio.Task | None = None

    def arm(self) -> None:
        """Call before every await that may wait (a no-op after the first)."""
        if self.armed:
            return
        self.task = asyncio.current_task()
        assert self.task is not None
        self.armed = True
        handle = self.handle
        if handle is None:
            self.watcher = asyncio.create_task(_watch_disconnect(self.receive, self))
        else:
            handle.on_lost(self.client_left)

    def disarm(self) -> None:
        if not self.armed:
            return
        self.armed = False
        if self.handle is not None:
            self.handle.on_lost(None)
        if self.watcher is not None:
            self.watcher.cancel()

    def client_left(self) -> None:
        if self.armed and not self.fired:
            self.fired = True
            assert self.task is not None
            self.task.cancel()


async def _watch_disconnect(receive: Receive, guard: _CancelOnDisconnect) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            guard.client_left()
            return


async def _no_receive() -> dict:
    return {"type": "http.disconnect"}
