"""Request bodies read with bounds decided before the work: size, nesting depth and time.

A body is read only after the route authenticated the caller. JSON is parsed only once the
body is known to be small (`MAX_JSON_BYTES`) and shallow (`MAX_JSON_DEPTH`): `json.loads` of
200,000 `[` recurses until Python gives up, and of 100 MB blocks the event loop for seconds.
A key twice in one object is refused at any depth: parsers disagree on which value wins, so
such a body could mean one thing to a proxy or an audit log and another to us.
Every receive waits at most the receive timeout, so a silent client cannot hold a request open;
an upload body must also keep a minimum rate after its first seconds (`MinimumRate`), so a
trickling one cannot either.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import ClientDisconnect, Request

from arkvory.shared.errors import InvalidInput, PayloadTooLarge, RequestTimeout

MAX_JSON_BYTES = 1024 * 1024
MAX_JSON_DEPTH = 32
# A decimal Content-Length of more than 19 digits exceeds any file and any int64.
_CONTENT_LENGTH = re.compile(r"[0-9]{1,19}")
# A JSON string (escapes included), as one linear-time match: the unrolled-loop form never
# backtracks, unlike `"(?:[^"\\]|\\.)*"`.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_OPEN_AS_SQUARE = bytes.maketrans(b"{}", b"[]")


# An upload body is judged on its rate only after this long (connection set-up, TCP slow start,
# a client that opens its file), or after the receive timeout when that is shorter: a body is
# never given longer to get going than it may stay silent.
MIN_RATE_GRACE_S = 10.0


class ReceiveTimedOut(RequestTimeout):
    """Raised instead of `TimeoutError`, which the HTTP edge reads as a slow database."""

    reason = "receive_timeout"  # the label of arkvory_transfer_aborts_total


class TooSlow(ReceiveTimedOut):
    """The body arrives, but slower than ARKVORY_MIN_UPLOAD_BYTES_PER_SECOND."""

    reason = "min_rate"


class MinimumRate:
    """Apache mod_reqtimeout's MinRate for one body: after a grace of `grace_s`, every byte
    received allows 1/`bytes_per_second` s more, with at most `grace_s` of credit banked, so a
    fast start cannot buy a trickle hours of holding its place.

    Only the time spent waiting for the client counts (`received` is told how long each wait
    took): time this server spends writing or recording a part is never held against it."""

    def __init__(self, bytes_per_second: int, grace_s: float) -> None:
        if bytes_per_second <= 0 or grace_s <= 0:
            raise ValueError(f"bytes_per_second and grace_s must be positive, got {bytes_per_second}, {grace_s}")
        self.bytes_per_second = bytes_per_second
        self.grace_s = grace_s
        self.waited_s = 0.0
        self._allowed_s = grace_s

    def seconds_left(self) -> float:
        """How much longer the client may take before the body is too slow."""
        return self._allowed_s - self.waited_s

    def received(self, size: int, waited_s: float) -> None:
        self.waited_s += waited_s
        self._allowed_s = min(self._allowed_s + size / self.bytes_per_second, self.waited_s + self.grace_s)

    def too_slow(self) -> TooSlow:
        return TooSlow(
            f"the request body arrived slower than {self.bytes_per_second} bytes/s after its first"
            f" {self.grace_s:g} s (ARKVORY_MIN_UPLOAD_BYTES_PER_SECOND)"
        )


def declared_length(request: Request) -> int | None:
    """The request's Content-Length, or None when it sends chunked or nothing declared."""
    value = request.headers.get("content-length")
    if value is None:
        return None
    if not _CONTENT_LENGTH.fullmatch(value):
        raise InvalidInput("Content-Length must be a decimal number of bytes")
    return int(value)


async def body_chunks(
    request: Request, timeout_s: float, min_rate: MinimumRate | None = None
) -> AsyncIterator[bytes]:
    """The body's chunks as they arrive; each wait for the next one is bounded by `timeout_s`,
    and with `min_rate` by the time the body has left before it is too slow.

    Reads the ASGI `receive` directly: Starlette's `request.stream()` would wait forever."""
    receive = request.receive
    while True:
        wait_s = timeout_s if min_rate is None else max(0.0, min(timeout_s, min_rate.seconds_left()))
        started = time.monotonic()
        try:
            async with asyncio.timeout(wait_s):
                message = await receive()
        except TimeoutError:
            if min_rate is not None and wait_s < timeout_s:
                min_rate.received(0, wait_s)
                raise min_rate.too_slow() from None
            raise ReceiveTimedOut(
                f"the request body sent no byte for {timeout_s:g} s"
            ) from None
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        if min_rate is not None:
            min_rate.received(len(chunk), time.monotonic() - started)
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


async def read_capped(request: Request, limit: int, timeout_s: float) -> bytes:
    """The whole body if it has at most `limit` bytes; a larger declared length is refused
    before a byte is read, a larger sent body as soon as it passes the limit."""
    declared = declared_length(request)
    if declared is not None and declared > limit:
        raise PayloadTooLarge(f"the body may have at most {limit} bytes")
    parts: list[bytes] = []
    size = 0
    async for chunk in body_chunks(request, timeout_s):
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the body may have at most {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


def nesting_within(body: bytes, max_depth: int) -> bool:
    """True if the brackets outside JSON strings nest at most `max_depth` deep and balance.

    Works in C-speed passes: strip the strings, keep only brackets, then peel off one level
    of innermost `[]` pairs per pass. Valid JSON of depth d is empty after d passes; anything
    left after `max_depth` passes is too deep or malformed (both are refused)."""
    brackets = _JSON_STRING.sub(b"", body).translate(_OPEN_AS_SQUARE, _NOT_BRACKETS)
    if b"[" * (max_depth + 1) in brackets:
        return False  # the usual attack (a long run of `[`) needs no peeling
    for _ in range(max_depth):
        if not brackets:
            return True
        brackets = brackets.replace(b"[]", b"")
    return not brackets


def _object_without_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's `object_pairs_hook`: called for every object, nested ones included."""
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                shown = key if len(key) <= 40 else key[:40] + "..."
                raise InvalidInput(f"the body has the key {shown!r} twice in one object")
            seen.add(key)
    return document


def parse_json_object(body: bytes, max_depth: int = MAX_JSON_DEPTH) -> dict[str, Any]:
    if not nesting_within(body, max_depth):
        raise InvalidInput(f"the body must be JSON nested at most {max_depth} levels deep")
    if not body.strip():
        raise InvalidInput("the body must be a JSON object")
    try:
        document = json.loads(body.decode("utf-8"), object_pairs_hook=_object_without_duplicate_keys)
    except (ValueError, UnicodeDecodeError):
        raise InvalidInput("the body must be JSON (UTF-8)") from None
    if not isinstance(document, dict):
        raise InvalidInput("the body must be a JSON object")
    return document


async def read_json_object(
    request: Request, timeout_s: float, limit: int = MAX_JSON_BYTES
) -> dict[str, Any]:
    """A small JSON object body; 413 above `limit`, 400 when too deep or not an object."""
    return parse_json_object(await read_capped(request, limit, timeout_s))
