"""The access log on our HTTP edge, in one process (shared/http/access_log.py): one line per
request with every field, the edge's own answers (400, 431, 500) included, client-chosen text
escaped or hidden, and a writer that falls behind dropping and counting lines instead of holding
up a request. The processes' lines (every route, every credential kind, a lease loss, a trusted
balancer) are in tests/test_access_log_processes.py."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import threading
import time
import uuid

import pytest

from arkvory.shared.http.access_log import AccessLog, note_principal
from arkvory.shared.http.edge import REQUEST_ID_KEY
from arkvory.shared.http.refusals import MAX_HEAD_BYTES
from arkvory.shared.http.server import HttpServer

from .test_http_edge import Served, heads

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
def anyio_backend():
    return ("asyncio", {"use_uvloop": True})


_LOGFMT = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')
_NUMBERS = ("status", "bytes_sent", "bytes_received")


def parse(line: str) -> dict:
    """An access line, text or JSON, as its fields (JSON's own keys left out; numbers as numbers,
    a text line's `-` as None)."""
    if line.startswith("{"):
        entry = json.loads(line)
        return {k: v for k, v in entry.items() if k not in ("time", "level", "logger", "message")}
    text = line.split(": ", 1)[1]
    fields = {k: json.loads(v) if v.startswith('"') else None if v == "-" else v for k, v in _LOGFMT.findall(text)}
    for name in _NUMBERS:
        fields[name] = int(fields[name])
    fields["duration_ms"] = float(fields["duration_ms"])
    return fields


class Lines(logging.Handler):
    """Keeps each line the access log wrote (a record is a batch of them), and its fields."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.fields: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        for line in record.getMessage().split("\n"):
            self.lines.append(line)
            self.fields.append(parse(line))


def access_logger(handler: logging.Handler) -> logging.Logger:
    logger = logging.getLogger(f"test.access.{uuid.uuid4().hex}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    return logger


async def app(scope, receive, send):
    """/fail raises, /cut starts a response and leaves it unfinished; the rest echoes the body's
    length. It gives itself a request id and a principal, as RequestContext and the routes do."""
    scope[REQUEST_ID_KEY] = "rid-" + scope["path"].strip("/")
    note_principal(scope, "key:tester")
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/fail":
        raise ValueError("the app failed")
    text = b"%d" % len(body)
    length = b"100" if scope["path"] == "/cut" else b"%d" % len(text)
    await send({"type": "http.response.start", "status": 201, "headers": [(b"content-length", length)]})
    if scope["path"] == "/cut":
        await send({"type": "http.response.body", "body": text, "more_body": True})
        return
    await send({"type": "http.response.body", "body": text})


async def serve_logged(access: AccessLog) -> Served:
    server = HttpServer(app, access_log=access)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await server.start(sock=sock)
    return Served(server, sock.getsockname()[1])


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_one_line_per_request_with_every_field_and_the_edges_own_answers(log_format, caplog):
    handler = Lines()
    access = AccessLog(log_format, logger=access_logger(handler), write_every_s=0.01)
    served = await serve_logged(access)
    try:
        upload = await served.exchange(
            b"PUT /up?path=a/b.txt&token=s3cret HTTP/1.1\r\nHost: x\r\nRange: bytes=0-9\r\n"
            b"Content-Length: 5\r\n\r\nhello"
        )
        failed = await served.exchange(b"GET /fail HTTP/1.1\r\nHost: x\r\n\r\n")
        cut = await served.exchange(b"GET /cut HTTP/1.1\r\nHost: x\r\n\r\n")
        malformed = await served.exchange(b"NOT HTTP AT ALL\r\n\r\n")
        too_large = await served.exchange(b"GET / HTTP/1.1\r\nX: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n")
    finally:
        await served.server.shutdown()  # the last lines are written by then
    assert heads(upload) == ["HTTP/1.1 201 Created"]
    assert heads(failed) == ["HTTP/1.1 500 Internal Server Error"]
    assert heads(malformed) == ["HTTP/1.1 400 Bad Request"]
    assert heads(too_large) == ["HTTP/1.1 431 Request Header Fields Too Large"]
    assert "Exception in ASGI application" in caplog.text

    assert len(handler.fields) == 5, handler.lines
    by_status = {fields["status"]: fields for fields in handler.fields if fields["request_id"] != "rid-cut"}
    # (No router here: the route is the processes' test's.)
    assert {key: by_status[201][key] for key in by_status[201] if key != "duration_ms"} == {
        "client": "127.0.0.1", "principal": "key:tester", "method": "PUT", "route": "unmatched",
        "path": "/up?path=a/b.txt&(hidden)", "status": 201, "bytes_sent": 1, "bytes_received": 5,
        "request_id": "rid-up", "range": "bytes=0-9", "end": "complete",
    }
    assert 0 < by_status[201]["duration_ms"] < 5000
    # The 500 the edge wrote for a failed app carries the app's request id, in the answer too.
    assert by_status[500]["request_id"] == "rid-fail" and b"x-request-id: rid-fail\r\n" in failed
    assert by_status[500]["end"] == "complete" and by_status[500]["bytes_sent"] > 0
    # The response left unfinished: its status, the byte that went, and how it ended.
    cut_line = next(f for f in handler.fields if f["request_id"] == "rid-cut")
    assert (cut_line["status"], cut_line["bytes_sent"], cut_line["end"]) == (201, 1, "incomplete")
    # The edge's own refusals: no app ran, so no method, route or principal; their own ids.
    for status, answer in ((400, malformed), (431, too_large)):
        line = by_status[status]
        rid = json.loads(answer.partition(b"\r\n\r\n")[2].removesuffix(b"<closed>"))["requestId"]
        assert (line["method"], line["route"], line["path"], line["principal"]) == (None, None, None, "anonymous")
        assert line["request_id"] == rid and line["client"] == "127.0.0.1" and line["bytes_sent"] > 0

    assert all("s3cret" not in line for line in handler.lines)
    put_line = next(line for line in handler.lines if "PUT" in line)
    if log_format == "json":
        entry = json.loads(put_line)
        assert entry["logger"].startswith("test.access.") and entry["message"] == "PUT /up?path=a/b.txt&(hidden) 201"
        assert entry["request_id"] == "rid-up" and entry["bytes_received"] == 5
    else:
        assert " INFO test.access." in put_line
        assert (
            'client=127.0.0.1 principal=key:tester method=PUT route=unmatched path="/up?path=a/b.txt&(hidden)" '
            "status=201 bytes_sent=1 bytes_received=5 duration_ms="
        ) in put_line
        assert put_line.endswith(' request_id=rid-up range="bytes=0-9" end=complete')


async def test_what_a_client_writes_cannot_forge_or_split_a_line():
    """A value with a quote, spaces or bytes beyond ASCII is quoted with JSON's escapes; a
    long one is cut (the queue and the line stay bounded)."""
    handler = Lines()
    access = AccessLog("text", logger=access_logger(handler), write_every_s=0.01)
    served = await serve_logged(access)
    try:
        await served.exchange(
            b'GET /x HTTP/1.1\r\nHost: x\r\nRange: bytes=1-2" end=complete forged=\xff\r\n\r\n'
            b"GET /y HTTP/1.1\r\nHost: x\r\nRange: " + b"9" * 5000 + b"\r\n\r\n"
        )
    finally:
        await served.server.shutdown()
    forged, long = handler.lines
    assert forged.endswith(r' range="bytes=1-2\" end=complete forged=\u00ff" end=complete'), forged
    assert len(long) < 1200 and "9" * 512 in long and "9" * 513 not in long


async def test_a_full_queue_drops_and_counts_lines_and_never_holds_up_a_request():
    """The handler hangs (a stderr nobody reads): the thread waits in it, four lines queue, the
    rest are dropped and counted, and every request is answered at once meanwhile."""
    entered, release = threading.Event(), threading.Event()

    class Hanging(Lines):
        def emit(self, record: logging.LogRecord) -> None:
            entered.set()
            release.wait(30)
            super().emit(record)

    handler = Hanging()
    access = AccessLog("text", logger=access_logger(handler), capacity=4, write_every_s=0.01)
    assert [sample.value for metric in access.collect() for sample in metric.samples] == [0]
    served = await serve_logged(access)
    try:
        await served.exchange(b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n", quiet_s=0.2)
        assert await asyncio.to_thread(entered.wait, 10)
        started = time.monotonic()
        answers = [await served.exchange(b"GET /%d HTTP/1.1\r\nHost: x\r\n\r\n" % n, quiet_s=0.2) for n in range(9)]
        assert all(heads(answer) == ["HTTP/1.1 201 Created"] for answer in answers)
        assert time.monotonic() - started < 9 * 0.2 + 5  # each answer came before its quiet time
        assert access.dropped == 5
        assert [sample.value for metric in access.collect() for sample in metric.samples] == [5]
    finally:
        release.set()
        await served.server.shutdown()
    assert [fields["request_id"] for fields in handler.fields] == ["rid-first", "rid-0", "rid-1", "rid-2", "rid-3"]


async def test_off_starts_no_thread_and_the_edge_tells_no_one():
    access = AccessLog("off")
    server = HttpServer(app, access_log=access)
    assert server.access_log is None
    before = {thread.name for thread in threading.enumerate()}
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await server.start(sock=sock)
    try:
        answer = await Served(server, sock.getsockname()[1]).exchange(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    finally:
        await server.shutdown()
    assert heads(answer) == ["HTTP/1.1 201 Created"]
    assert "arkvory access log" not in before | {thread.name for thread in threading.enumerate()}
