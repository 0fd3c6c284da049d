"""A streamed GET whose body is read straight from the socket, for large downloads.

httpx parses bodies with h11, which copies each 64 KiB read into and out of its receive
buffer: on this project's 2-core test host that caps a 1 GiB download at 120-370 MiB/s where
`curl -o /dev/null` does 1,000+. The standard library's http.client reads a Content-Length body
with one `recv_into` per call into the buffer we hand it, at curl's speed. So the content GET of
a download goes through here; every other request (small JSON) stays on httpx.

Same rules as the httpx transport: the token only in the Authorization header, the same
timeout, TLS verified with the default context. No environment proxies (a balancer address is
what the client is for).
"""

from __future__ import annotations

import http.client
import socket
import ssl
import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import httpx


class Headers(Protocol):
    """Response headers looked up by name, case-insensitively (httpx.Headers, or http.client's
    message: a download does not load httpx unless it needs it)."""

    def get(self, name: str, default: str | None = None) -> str | None: ...

# What a dropped, reset or stalled connection raises while we read (all mean "no answer").
NETWORK_ERRORS: tuple[type[BaseException], ...] = (OSError, http.client.HTTPException, socket.timeout)
MAX_ERROR_BODY = 64 * 1024  # an error answer's JSON is small; never read more of it


class RawResponse:
    """Status, headers and a readable body of one GET; `close()` drops the connection."""

    def __init__(self, connection: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        self._connection = connection
        self._response = response
        self.status_code = response.status
        self.headers: Headers = response.msg

    def readinto(self, buffer: memoryview) -> int:
        """Up to len(buffer) body bytes (0 at the end); raises a NETWORK_ERRORS on a cut."""
        return self._response.readinto(buffer)

    def as_httpx(self) -> httpx.Response:
        """This answer with (the start of) its body, for the error mapping of errors.py."""
        import httpx

        try:
            body = self._response.read(MAX_ERROR_BODY)
        except NETWORK_ERRORS:
            body = b""
        return httpx.Response(self.status_code, headers=self._response.getheaders(), content=body)

    def close(self) -> None:
        # The response's file object holds the socket too: close both, or it lingers.
        self._response.close()
        self._connection.close()


def open_get(
    url: str,
    params: Mapping[str, str],
    headers: Mapping[str, str],
    *,
    timeout: float,
) -> RawResponse:
    """Send `GET url?params` and read the status line and headers."""
    parts = urllib.parse.urlsplit(url)
    target = parts.path or "/"
    if params:
        target += "?" + urllib.parse.urlencode(params)
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        connection = http.client.HTTPSConnection(
            parts.hostname or "", parts.port, timeout=timeout, context=ssl.create_default_context()
        )
    else:
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    try:
        connection.request("GET", target, headers={**headers, "Connection": "close"})
        return RawResponse(connection, connection.getresponse())
    except BaseException:
        connection.close()
        raise
