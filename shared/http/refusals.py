"""Whole answers the HTTP edge writes itself, before or instead of the app: a request the parser
cannot read (400), a head too large (431), an app that failed before it answered (500). Each is
the JSON error shape every other answer has, with a request id of its own (no app ran that could
have made one), and ends the connection."""

from __future__ import annotations

import json
import secrets

MAX_HEAD_BYTES = 64 * 1024  # the request line and headers, counted before they are parsed


def refusal_response(status: int, reason: str, code: str, message: str, headers: bytes = b"") -> bytes:
    """The whole response: status line, `headers` (whole lines), the JSON body."""
    rid = secrets.token_hex(8)
    body = json.dumps({"code": code, "message": message, "requestId": rid}).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\n".encode()
        + headers
        + b"content-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n"
        b"x-request-id: " + rid.encode() + b"\r\n"
        b"connection: close\r\n\r\n" + body
    )


def bad_request_response(date_line: bytes) -> bytes:
    return refusal_response(400, "Bad Request", "invalid_input", "Invalid HTTP request received.", date_line)


def head_too_large_response() -> bytes:
    return refusal_response(
        431, "Request Header Fields Too Large", "request_header_too_large",
        f"the request line and headers exceed {MAX_HEAD_BYTES} bytes",
    )


def internal_error_response(date_line: bytes) -> bytes:
    return refusal_response(500, "Internal Server Error", "internal", "Internal Server Error", date_line)
