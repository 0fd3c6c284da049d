"""The body of one download written straight to its connection (transfer.py's BlobResponse
decides what is sent, under which place and pin): tokens from the buckets before every write,
the payload gate at the write, `os.sendfile` on plain TCP, and how a transfer ends early (cut
for a lost lease, or a client gone), counted once. `send_payload` is the frame every sending
loop runs in, a file's (`Payload`) and an object store's (object_transfer.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from arkvory.shared.auth.identity import Principal
from arkvory.shared.cluster.transfers import Aborter
from arkvory.shared.errors import LeaseLost, TransferAborted
from arkvory.shared.http.protocol import ConnectionHandle, PayloadRefused

from .serving import ServingProcess

log = logging.getLogger("arkvory.content")


class SentResponse(Protocol):
    """What a Payload needs of the response whose body it sends (transfer.py's BlobResponse):
    whose bytes they are, and how it reports a client too slow or a blob too short."""

    principal: Principal

    def _send_timed_out(self, handle: ConnectionHandle) -> None: ...

    def _short_read(self) -> TransferAborted: ...

UNTHROTTLED_CHUNK = 1024 * 1024  # an unmetered transfer moves this much per write
# Below this a body is copied: headers and body then leave in one go, which beats a sendfile.
SENDFILE_MIN_BYTES = 64 * 1024
# When sendfile sends nothing and the socket could not be waited for, this much is copied into
# the transport instead (its flow control then says when it has left).
COPY_PIECE_BYTES = 16 * 1024
# The most one sendfile moves when the buckets have tokens to spare: what loopback's largest
# socket buffer holds (tcp_wmem), so one call can fill it.
ZERO_COPY_BYTES = 4 * 1024 * 1024


class Payload:
    """The body of one download, written straight to its connection: the general path, which
    may wait (BlobResponse._send_at_once writes a small body that need not).

    Before every write: tokens from both buckets and the socket able to take more within the
    send timeout; at the write itself, in the same synchronous step, the payload gate
    (`ConnectionHandle.write`/`sendfile` raise PayloadRefused when trust is over, and
    `send_payload` cuts the transfer and counts it as an abort `lease_lost`). On plain TCP
    the bytes go with `os.sendfile` from the page cache to the socket (uvloop has no
    `loop.sendfile`), several grants per call when the buckets have tokens to spare; when the
    socket is full, the handle waits for the socket itself to take more (nothing is copied to
    learn that). With the transport's write-buffer limits at zero "writable" means "nothing
    queued", so a sendfile never overtakes queued bytes. TLS, and small bodies, take the
    copying path.

    It runs in `send_payload`, registered with the process's `transfers` (a Payload is its own
    aborter), so that a lost lease cuts it while it waits.
    """

    __slots__ = ("runtime", "response", "handle", "fd")

    def __init__(self, runtime: ServingProcess, response: SentResponse, handle: ConnectionHandle, fd: int) -> None:
        self.runtime = runtime
        self.response = response
        self.handle = handle
        self.fd = fd

    def __call__(self, reason: str) -> None:
        """Cut the transfer now (the lease is lost, pins cannot be written), counted as `reason`."""
        self.runtime.metrics.transfer_aborts.labels(direction="download", reason=reason).inc()
        self.handle.abort()

    async def send(
        self,
        offset: int,
        remaining: int,
        granted: int = 0,
        head: tuple[int, bytes, int, bytes] | None = None,
    ) -> bool:
        """True when every byte was handed over; False when the connection is gone or was cut.
        `granted`: bytes that already passed the buckets. `head`: the arguments of
        `ConnectionHandle.start` (status, header block, content length, extra lines) when the
        head is not written yet: it goes with the first bytes in one write, or, for a body
        sent with sendfile, alone before the first grant."""
        return await send_payload(self.runtime, self.handle, self, self._send(offset, remaining, granted, head))

    async def _send(
        self, offset: int, remaining: int, granted: int, head: tuple[int, bytes, int, bytes] | None
    ) -> bool:
        runtime, handle, fd = self.runtime, self.handle, self.fd
        bandwidth = runtime.bandwidth
        principal_id = self.response.principal.id
        timeout = runtime.settings.send_timeout_s
        payload = runtime.metrics.payload_bytes
        chunk = UNTHROTTLED_CHUNK if bandwidth.unlimited else bandwidth.quantum_bytes
        zero_copy = handle.can_sendfile and remaining > SENDFILE_MIN_BYTES
        flow = handle.cycle.flow
        if head is not None and zero_copy:
            # A large body's head does not wait for its first tokens.
            if flow.write_paused and not await handle.writable(timeout):
                self.response._send_timed_out(handle)
                return False
            handle.start(*head)
            head = None
        if zero_copy:
            handle.transport.set_write_buffer_limits(high=0, low=0)
        # `granted`: passed the buckets, not yet handed over (a partial sendfile keeps the rest)
        while remaining:
            if not granted:
                want = min(remaining, chunk)
                granted = bandwidth.grant_now(principal_id, want) or await bandwidth.grant(principal_id, want)
                if zero_copy and granted < remaining:
                    # Tokens to spare: one sendfile moves several grants (issue 26).
                    granted += bandwidth.grant_now_up_to(principal_id, min(remaining, ZERO_COPY_BYTES) - granted)
            # Asked only when the transport is paused: a coroutine per chunk costs more than
            # the check (the Python work per MiB is what a slower host pays for twice).
            if flow.write_paused and not await handle.writable(timeout):
                self.response._send_timed_out(handle)
                return False
            if handle.lost:
                _client_gone(runtime, handle, "it closed the connection")
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
            if not sent and not (zero_copy and flow.write_paused):  # (paused: the socket is full)
                size = granted if not zero_copy else min(granted, COPY_PIECE_BYTES)
                data = os.pread(fd, size, offset)
                if len(data) != size:
                    raise self.response._short_read()
                if head is not None:  # the head and the first bytes in one write
                    handle.start(*head, data)
                    head = None
                else:
                    handle.write(data)
                sent = size
            offset += sent
            remaining -= sent
            granted -= sent
            payload.inc(sent)
        return await self._flushed()

    async def flushed(self) -> bool:
        """`send`'s end for a body handed over without it (BlobResponse._send_at_once) whose
        socket was full: registered while it waits."""
        return await send_payload(self.runtime, self.handle, self, self._flushed())

    async def _flushed(self) -> bool:
        """Every byte is handed over: wait (within the send timeout) for the transport to pass
        it on, as the exchange's last body message would."""
        handle = self.handle
        if handle.cycle.flow.write_paused and not await handle.writable(self.runtime.settings.send_timeout_s):
            self.response._send_timed_out(handle)
            return False
        if handle.lost:
            _client_gone(self.runtime, handle, "it closed the connection")
            return False
        return True


async def send_payload(
    runtime: ServingProcess, handle: ConnectionHandle, aborter: Aborter, sending: Coroutine[Any, Any, bool]
) -> bool:
    """Run one download's sending loop, `sending` (`Payload`'s from a file, object_transfer.py's
    from the store), and return what it returns: True when every byte was handed over.

    The frame every payload is sent in. While the loop runs it is registered with the process's
    transfers (`aborter`), so that a lost lease cuts it while it waits on a slow socket. And it
    is the one place where the loop meets the lease's end itself: a write refused by the payload
    gate (PayloadRefused, raised by every payload write of ConnectionHandle, nothing written) or
    buckets closed by the loss (LeaseLost). Either ends the transfer as the registry's cut does:
    the connection reset (SO_LINGER 0, so that nothing queued still leaves), counted once as an
    abort `lease_lost`, and the loop ended quietly (False), never an error that reaches the edge.
    The gate may close between any two steps of a loop (the lease's trust is a deadline, and the
    renewal thread may declare the loss at any moment), so no loop checks it beforehand: the
    write decides."""
    runtime.transfers.add(aborter)
    try:
        return await sending
    except (PayloadRefused, LeaseLost):
        _cut_for_lease(runtime, handle)  # usually done already by the registry's abort_all
        return False
    finally:
        runtime.transfers.discard(aborter)


def _cut_for_lease(runtime: ServingProcess, handle: ConnectionHandle) -> None:
    """The payload gate said no at the write, or the buckets closed: cut, counted once. (Called
    by `send_payload`, and by the one write that does not wait, BlobResponse._send_at_once.)"""
    if not handle.lost:
        runtime.metrics.transfer_aborts.labels(direction="download", reason="lease_lost").inc()
        handle.abort()


def _client_gone(runtime: ServingProcess, handle: ConnectionHandle, why: str) -> None:
    """The client left in the middle of its download (a reset, a broken pipe, a close): an
    abort like the server's own cuts, counted once per transfer, and not an error of ours, so
    it is logged at debug only."""
    handle.cycle.disconnected = True  # the server then reports no unfinished response
    if handle.cut:
        return  # the server had cut it already (and counted why)
    handle.cut = True
    runtime.metrics.transfer_aborts.labels(direction="download", reason="client_gone").inc()
    log.debug("download aborted: the client left (%s)", why)


def transfer_aborter(runtime: ServingProcess, handle: ConnectionHandle) -> Callable[[str], None]:
    """What the process's transfer registry calls to cut this download (lease lost, pins
    untrusted, shutdown): counted by its reason, then the connection is reset."""

    def abort(reason: str) -> None:
        runtime.metrics.transfer_aborts.labels(direction="download", reason=reason).inc()
        handle.abort()

    return abort
