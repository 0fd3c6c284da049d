"""Whole answers the HTTP edge writes itself, before or instead of the app: a request the parser
cannot read (400), a head too large (431), an app that failed before it answered (500). Each is
the JSON error shape every other answer has, with a request id (the request's own when an app
had given it one, else a new one: no app ran that could have made one), and ends the connection."""

from __future__ import annotations

import json
import secrets
from typing import NamedTuple

MAX_HEAD_BYTES = 64 * 1024  # the request line and headers, counted before they are parsed
# Where a request's id is kept in its scope (edge.RequestContext sets it).
REQUEST_ID_KEY = "arkvory.request_id"


class Refusal(NamedTuple):
    """The whole response, and what the access log says of it."""

    response: bytes
    request_id: str
    body_bytes: int


def refusal_response(
    status: int, reason: str, code: str, message: str, headers: bytes = b"", rid: str | None = None
) -> Refusal:
    """The whole response: status line, `headers` (whole lines), the JSON body."""
    rid = rid or secrets.token_hex(8)
    body = json.dumps({"code": code, "message": message, "requestId": rid}).encode()
    response = (
        f"HTTP/1.1 {status} {reason}\r\n".encode()
        + headers
        + b"content-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n"
        b"x-request-id: " + rid.encode() + b"\r\n"
        b"connection: close\r\n\r\n" + body
    )
    return Refusal(response, rid, len(body))


def bad_request_response(date_line: bytes) -> Refusal:
    return refusal_response(400, "Bad Request", "invalid_input", "Invalid HTTP request received.", date_line)


def head_too_large_response() -> Refusal:
    return refusal_response(
        431, "Request Header Fields Too Large", "request_header_too_large",
        f"the request line and headers exceed {MAX_HEAD_BYTES} bytes",
    )


def internal_error_response(date_line: bytes, rid: str | None = None) -> Refusal:
    """`rid`: the request's id, so that the answer, the error's log line and the access line
    name the same request."""
    return refusal_response(500, "Internal Server Error", "internal", "Internal Server Error", date_line, rid)
