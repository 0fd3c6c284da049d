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

from .test_http_edge import Served, heads, read_body

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
    body = await read_body(receive)
    if scope["path"] == "/fail":
        raise ValueError("the app failed")
    text = b"%d" % len(body)
    length = b"100" if scope["path"] == "/cut" else b"%d" % len(text)
    await send({"type": "http.response.start", "status": 201, "headers": [(b"content-length", length)]})
    if scope["path"] == "/cut":
        await send({"type": "http.response.body", "body": text, "more_body": True})
        return
    await send({"type": "http.response.body", "body": text})


async def serve_logged(access: AccessLog, served_app=app) -> Served:
    server = HttpServer(served_app, access_log=access)
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


# -- hostile requests cannot forge or split a line -------------------------------------------

_VALUE = r'("(?:[^"\\]|\\.)*"|[^\s"=\\]+)'
_TEXT_LINE = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO (\S+): "
    rf"client={_VALUE} principal={_VALUE} method={_VALUE} route={_VALUE} path={_VALUE} "
    r"status=(\d+) bytes_sent=(\d+) bytes_received=(\d+) duration_ms=(\d+\.\d{3}) "
    rf"request_id={_VALUE} range={_VALUE} end=(complete|cut|client_left|incomplete)"
)
_TEXT_FIELDS = (
    "client", "principal", "method", "route", "path", "status", "bytes_sent", "bytes_received",
    "duration_ms", "request_id", "range", "end",
)
_JSON_KEYS = {"time", "level", "logger", "message", *_TEXT_FIELDS}
# What a client might send to break a line. httptools lets through, in header values: quotes,
# backslashes, spaces, tabs, `=`, a forged field, bytes past ASCII; in a path: quotes,
# backslashes, braces and percent-escapes of anything (the request id below is made of the
# decoded path, so NUL, CR, LF and ESC reach the line there). It refuses a control character
# (NUL, ESC, DEL, a bare CR or LF, a folded line) in a header or a byte past ASCII in the path:
# those requests get a line of the edge's own (400), as does a head over 64 KiB (431).
_PASSES = [
    b'"', b"\\", b"=", b" ", b"\t", b"\xff\xfe", b"\xc3\xa9", b" end=complete status=200",
    b'", "status": 200, "x": "', b"}{", b"'", b"-", b"{repo}", b"(hidden)", b"null",
]
_REFUSED = [b"\x00", b"\x1b[31m", b"\x7f", b"\r", b"\n", b"\r\n end=complete", b"}\n{"]
_IN_PATH = [
    b"%0A", b"%0D%0A", b"%22", b"%00", b"%1B", b"%7F", b"%FF", b"%5C", b"%20end=complete", b"%7D%0A%7B",
    b'"', b"\\", b"=", b"'", b"{", b"}", b"|", b"`", b"^", b"<", b">",
]


def _hostile_text(rng, length: int, pieces: list[bytes]) -> bytes:
    text, size = [], 0
    while size < length:
        piece = rng.choice(pieces) if rng.random() < 0.5 else bytes([rng.randrange(0x21, 0x7f)])
        text.append(piece)
        size += len(piece)
    return b"".join(text)[:length]


def _url_text(rng, length: int) -> bytes:
    return _hostile_text(rng, length, _IN_PATH).replace(b"?", b"%3F").replace(b"#", b"%23").replace(b"&", b"%26")


def _hostile_request(rng, seq: int) -> bytes:
    """One request whose path, query and headers are hostile; one in four carries what the
    parser refuses (somewhere in its head), one in eight a head over 64 KiB."""
    refused, huge = rng.random() < 0.25, rng.random() < 0.125
    header_pieces = _PASSES + _REFUSED if refused else _PASSES
    path = b"/" + _url_text(rng, rng.choice((8, 64, 600, 20000, 40000)) + (70000 if huge else 0))
    if refused and rng.random() < 0.3:
        path += rng.choice((b"\xff", b"\x7f", b"\x00", b'\x1b'))
    query = b"path=" + _url_text(rng, 20) + b"&token=SECRET%d&limit=5" % seq
    method = b'GE"T' if refused and rng.random() < 0.2 else rng.choice((b"GET", b"PUT"))
    head = [method + b" " + path + b"?" + query + b" HTTP/1.1", b"Host: x", b"X-Seq: %d" % seq, b"Connection: close"]
    if rng.random() < 0.8:
        head.append(b"Range: bytes=" + _hostile_text(rng, rng.choice((10, 100, 3000)), header_pieces))
    if rng.random() < 0.8:
        # From a trusted balancer: a valid hop, or garbage where an address should be.
        hop = rng.choice((b"203.0.113.7", b"198.51.100.1, 203.0.113.7", _hostile_text(rng, 40, header_pieces)))
        head.append(b"X-Forwarded-For: " + hop)
    return b"\r\n".join(head) + b"\r\n\r\n"


def _parse_strictly(line: str, log_format: str) -> dict:
    """The fields of a line that must be exactly one access line: every character printable
    ASCII; JSON with exactly its keys, or text that matches the whole grammar in order."""
    assert all(" " <= character <= "~" for character in line), repr(line)
    if log_format == "json":
        entry = json.loads(line)
        assert set(entry) == _JSON_KEYS, entry
        unknown = "-"
        method, path = entry["method"] or unknown, entry["path"] or unknown
        assert entry["message"] == f"{method} {path} {entry['status']}"
        return entry
    matched = _TEXT_LINE.fullmatch(line)
    assert matched, line
    values = dict(zip(_TEXT_FIELDS, matched.groups()[1:]))
    for name in ("client", "principal", "method", "route", "path", "request_id", "range"):
        text = values[name]
        values[name] = json.loads(text) if text.startswith('"') else None if text == "-" else text
    for name in _NUMBERS:
        values[name] = int(values[name])
    return values


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_hostile_request_lines_and_headers_cannot_forge_or_split_a_line(log_format):
    """A seeded stream of hostile requests, one connection each: exactly one line per request
    (none split, none forged), each in its format's whole grammar, and every client-chosen value
    in it the one the request carried (cut at 512 bytes), or `(hidden)` for a query parameter
    that is not the API's own."""
    import ipaddress
    import random

    rng = random.Random(24)
    seen: dict[int, dict] = {}

    async def recording(scope, receive, send):
        headers = dict(scope["headers"])
        seen[int(headers[b"x-seq"])] = {
            "raw_path": scope["raw_path"], "query": scope["query_string"], "range": headers.get(b"range"),
            "forwarded": headers.get(b"x-forwarded-for"), "path": scope["path"],
        }
        scope[REQUEST_ID_KEY] = "rid-" + scope["path"][:100]  # decoded: %0A is a newline here
        note_principal(scope, "key:tester")
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    class RawLines(logging.Handler):  # (not parsed here: that is the test)
        def __init__(self) -> None:
            super().__init__()
            self.lines: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.lines.extend(record.getMessage().split("\n"))

    handler = RawLines()
    access = AccessLog(
        log_format, (ipaddress.ip_network("127.0.0.0/8"),), logger=access_logger(handler), write_every_s=0.01
    )
    served = await serve_logged(access, recording)
    requests = [_hostile_request(rng, seq) for seq in range(120)]
    try:
        for request in requests:
            answer = await served.exchange(request, quiet_s=5)
            assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    finally:
        await served.server.shutdown()

    assert len(handler.lines) == len(requests), "a line was split, forged or lost"
    assert 20 < len(seen) < len(requests) - 20, "both answered and refused requests"
    for seq, line in enumerate(handler.lines):
        fields = _parse_strictly(line, log_format)
        assert "SECRET" not in line
        ipaddress.ip_address(fields["client"])  # an address, whatever X-Forwarded-For held
        request = seen.get(seq)
        if request is None:  # refused by the parser (400) or too large (431): the edge's line
            assert fields["status"] in (400, 431) and (fields["method"], fields["path"]) == (None, None), line
            continue
        shown_query = "&".join(
            piece if piece.partition("=")[0] in ("path", "limit") else "(hidden)"
            for piece in request["query"].decode("latin-1").split("&")
        )
        assert fields["path"] == request["raw_path"][:512].decode("latin-1") + "?" + shown_query
        assert fields["range"] == (None if request["range"] is None else request["range"][:512].decode("latin-1"))
        assert fields["request_id"] == "rid-" + request["path"][:100]
        assert (fields["status"], fields["bytes_sent"], fields["principal"]) == (200, 2, "key:tester")
        if request["forwarded"] in (b"203.0.113.7", b"198.51.100.1, 203.0.113.7"):
            assert fields["client"] == "203.0.113.7"


# Declared query parameters whose values the access log must not write (none so far).
NOT_LOGGED: frozenset[str] = frozenset()


def test_every_query_parameter_the_api_declares_is_logged_or_named_as_not():
    """A parameter a route starts to read shows in the lines (or is named here as secret), so
    the path of a filtered list is not a row of `(hidden)`."""
    from arkvory.shared.download.content import QUERY_PARAMETERS
    from arkvory.shared.http.access_log import LOGGED_QUERY_PARAMETERS
    from arkvory.writer import openapi
    from arkvory.writer.app import ROUTE_MODULES

    declared = {name for names in QUERY_PARAMETERS.values() for name in names}
    for operations in openapi.build_document(ROUTE_MODULES)["paths"].values():
        for operation in operations.values():
            if isinstance(operation, dict):
                declared |= {p["name"] for p in operation.get("parameters", []) if p.get("in") == "query"}
    unlisted = declared - LOGGED_QUERY_PARAMETERS - NOT_LOGGED
    assert not unlisted, (
        f"{sorted(unlisted)}: add each to access_log.LOGGED_QUERY_PARAMETERS, or to NOT_LOGGED here "
        "if its value may be a secret"
    )
