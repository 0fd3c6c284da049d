"""The writer's own API, called in-process for one console request.

A console action is the API request a client would send, handed to the writer's Starlette
program directly (no socket): the same route reads the same bounded body, checks the same
permissions and idempotency key, and answers the same JSON. The console's only credential is
the signed-in session, sent as the bearer; the browser's address (and the `X-Forwarded-For`
of a trusted balancer) travel along, so login limits and logs see the real client.

An answer of 400 or more raises `Refused` with the API's own code and message, which the page
shows. An error inside the API (its exception handlers already answered 500 and logged it) is
a `Refused` too, never a traceback on the page.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message

from arkvory.shared.errors import InvalidInput
from arkvory.shared.http.edge import REQUEST_ID_KEY, request_id

MAX_ANSWER_BYTES = 16 * 1024 * 1024  # API answers are bounded lists; this bounds a surprise


class Refused(Exception):
    """The API said no: its status, code and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class Answer:
    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def header(self, name: str) -> str | None:
        wanted = name.lower().encode("latin-1")
        for key, value in self.headers:
            if key.lower() == wanted:
                return value.decode("latin-1")
        return None

    def header_values(self, name: str) -> list[str]:
        wanted = name.lower().encode("latin-1")
        return [value.decode("latin-1") for key, value in self.headers if key.lower() == wanted]

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def refusal(self) -> Refused:
        try:
            body = self.json()
            return Refused(self.status, str(body["code"]), str(body["message"]))
        except (ValueError, TypeError, KeyError):
            return Refused(self.status, "internal", f"the API answered {self.status}")


_NO_BODY = object()


class InternalApi:
    """The writer's API as `token` (a session), for the console request `request`."""

    def __init__(self, writer_app: ASGIApp, request: Request, token: str | None) -> None:
        self.writer_app = writer_app
        self.request = request
        self.token = token

    def _scope(self, method: str, path: str, query: Mapping[str, str] | None, headers: Sequence[tuple[str, str]]):
        outer = self.request.scope
        raw = [(b"host", (self.request.headers.get("host") or "console").encode("latin-1"))]
        # The browser's own address as the API would see it (shared/http/client_address.py).
        raw += [(key, value) for key, value in outer["headers"] if key == b"x-forwarded-for"]
        if self.token is not None:
            raw.append((b"authorization", f"Bearer {self.token}".encode("latin-1")))
        # Values from forms (an idempotency key) go as UTF-8 bytes: the route checks them, as
        # it checks what arrives over HTTP.
        raw += [(name.lower().encode("latin-1"), value.encode("utf-8", "surrogatepass")) for name, value in headers]
        encoded_path = urllib.parse.quote(path, safe="/@:")
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1",
            "method": method,
            "scheme": outer.get("scheme", "http"),
            "path": path,
            "raw_path": encoded_path.encode("ascii"),
            "root_path": "",
            "query_string": urllib.parse.urlencode(query or {}).encode("ascii"),
            "headers": raw,
            "client": outer.get("client"),
            "server": outer.get("server"),
            "state": {},
            "extensions": {},
            REQUEST_ID_KEY: request_id(outer),
        }

    async def call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = _NO_BODY,
        stream: AsyncIterator[bytes] | None = None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> Answer:
        """One API request; `body` is sent as JSON, `stream` as raw bytes (chunk by chunk)."""
        extra = list(headers)
        if body is not _NO_BODY:
            payload = json.dumps(body).encode()
            extra += [("content-type", "application/json"), ("content-length", str(len(payload)))]

            async def one_chunk() -> AsyncIterator[bytes]:
                yield payload

            stream = one_chunk()
        scope = self._scope(method, path, query, extra)
        finished = asyncio.Event()
        chunks = stream.__aiter__() if stream is not None else None
        body_done = False

        async def receive() -> Message:
            nonlocal body_done
            if not body_done:
                if chunks is not None:
                    try:
                        chunk = await chunks.__anext__()
                    except StopAsyncIteration:
                        chunk = b""
                    else:
                        return {"type": "http.request", "body": chunk, "more_body": True}
                body_done = True
                return {"type": "http.request", "body": chunk, "more_body": False}
            await finished.wait()  # like a client that stays until the answer ends
            return {"type": "http.disconnect"}

        start: Message | None = None
        parts: list[bytes] = []
        size = 0

        async def send(message: Message) -> None:
            nonlocal start, size
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                size += len(message.get("body", b""))
                if size > MAX_ANSWER_BYTES:
                    raise Refused(502, "internal", "the API's answer is larger than the console reads")
                parts.append(message.get("body", b""))

        try:
            await self.writer_app(scope, receive, send)
        except Refused:
            raise
        except Exception:
            # The API's handlers answered (500) and logged it before re-raising: the answer stands.
            if start is None:
                raise
        finally:
            finished.set()
        assert start is not None
        return Answer(start["status"], list(start.get("headers", [])), b"".join(parts))

    async def fetch(self, path: str, query: Mapping[str, str] | None = None) -> Any:
        """GET `path`: its JSON, or `Refused`."""
        answer = await self.call("GET", path, query={k: v for k, v in (query or {}).items() if v is not None})
        if answer.status >= 400:
            raise answer.refusal()
        return answer.json()

    async def change(
        self,
        method: str,
        path: str,
        body: Any = _NO_BODY,
        *,
        key: str | None = None,
        query: Mapping[str, str] | None = None,
    ) -> Answer:
        """A change: its answer, or `Refused`. `key` is sent as the Idempotency-Key (a form's
        own, so a form sent twice is one change)."""
        headers = [("idempotency-key", key)] if key else []
        answer = await self.call(method, path, query=query, body=body, headers=headers)
        if answer.status >= 400:
            raise answer.refusal()
        return answer


def api_path(*parts: str) -> str:
    """/api/v1/<parts>, each part exactly one path segment: a value from a form can never
    reach another route than the one meant (the route itself then checks the value)."""
    for part in parts:
        if not part or "/" in part or part in (".", "..") or not part.isprintable():
            raise InvalidInput(f"{part!r} cannot be part of a path: no '/', no control characters")
    return "/api/v1/" + "/".join(parts)
