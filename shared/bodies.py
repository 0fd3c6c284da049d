"""Request bodies read with bounds decided before the work: size, nesting depth and time.

A body is read only after the route authenticated the caller. JSON is parsed only once the
body is known to be small (`MAX_JSON_BYTES`) and shallow (`MAX_JSON_DEPTH`): `json.loads` of
200,000 `[` recurses until Python gives up, and of 100 MB blocks the event loop for seconds.
A key twice in one object is refused at any depth: parsers disagree on which value wins, so
such a body could mean one thing to a proxy or an audit log and another to us.
Every receive waits at most the receive timeout, so a silent client cannot hold a request open.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import ClientDisconnect, Request

from .errors import InvalidInput, PayloadTooLarge, RequestTimeout

MAX_JSON_BYTES = 1024 * 1024
MAX_JSON_DEPTH = 32
# A decimal Content-Length of more than 19 digits exceeds any file and any int64.
_CONTENT_LENGTH = re.compile(r"[0-9]{1,19}")
# A JSON string (escapes included), as one linear-time match: the unrolled-loop form never
# backtracks, unlike `"(?:[^"\\]|\\.)*"`.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_OPEN_AS_SQUARE = bytes.maketrans(b"{}", b"[]")


class ReceiveTimedOut(RequestTimeout):
    """Raised instead of `TimeoutError`, which the HTTP edge reads as a slow database."""


def declared_length(request: Request) -> int | None:
    """The request's Content-Length, or None when it sends chunked or nothing declared."""
    value = request.headers.get("content-length")
    if value is None:
        return None
    if not _CONTENT_LENGTH.fullmatch(value):
        raise InvalidInput("Content-Length must be a decimal number of bytes")
    return int(value)


async def body_chunks(request: Request, timeout_s: float) -> AsyncIterator[bytes]:
    """The body's chunks as they arrive; each wait for the next one is bounded by `timeout_s`.

    Reads the ASGI `receive` directly: Starlette's `request.stream()` would wait forever."""
    receive = request.receive
    while True:
        try:
            async with asyncio.timeout(timeout_s):
                message = await receive()
        except TimeoutError:
            raise ReceiveTimedOut(
                f"the request body sent no byte for {timeout_s:g} s"
            ) from None
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
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
