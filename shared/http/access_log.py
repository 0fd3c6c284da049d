"""The access log (ARKVORY_ACCESS_LOG=text|json): one line per request, made off the serving path.

At the end of every request the edge (protocol.py, the one place that sees them all, its own
400/431/500 answers and cut downloads included) hands over what it knows as a tuple: a few
attribute reads and one pass over the headers for `Range` and `X-Forwarded-For`, no formatting,
no lock. The tuple goes to a bounded queue; a thread of its own takes what is there every
WRITE_EVERY_S, works out the client's address, builds a record of the logger `arkvory.access`
and hands it to that logger's handlers (logs.configure: stderr, text or JSON). A slow stderr or
journal thus slows that thread only: when the queue is full, the line is dropped and counted in
`arkvory_access_log_dropped_lines_total`, and the request never waits.

What a line holds: the time the request ended, the client's address as `ARKVORY_TRUSTED_PROXIES`
lets us believe it (client_address.py), the principal's id (`key:…`, `account:<uuid>`,
`service:<uuid>`, `anonymous`: never a token), method, route template, path, status, payload
bytes sent and received, duration, request id, the `Range` asked for, and how it ended. It never
holds a header but `Range` (and `X-Forwarded-For`, as the address it gives), a body, or a query
parameter that is not one of the API's own (LOGGED_QUERY_PARAMETERS): no credential travels in a
URL (SPEC §5), but a client that puts one in a query string by mistake must not find it in our
logs.
"""

from __future__ import annotations

import collections
import json
import logging
import re
import threading
import time
from typing import Any

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector
from starlette.types import Scope

from arkvory.shared.logs import ACCESS_LOGGER

from .client_address import Network, address_of
from .exchange import Exchange
from .refusals import REQUEST_ID_KEY

# Where the principal's id is kept in a request's scope (`note_principal`).
PRINCIPAL_KEY = "arkvory.principal"
ANONYMOUS = "anonymous"
# A few seconds of a busy process's requests (issue 6: ~5 k small requests/s per process).
QUEUE_LINES = 16384
WRITE_EVERY_S = 0.1  # how long a line waits, at most, before the thread writes it
# Bytes kept of a client-chosen field (path, query, Range, X-Forwarded-For): bounds both the
# queue's memory and the line, whatever head (up to 64 KiB) the client sent.
FIELD_BYTES = 512
# Query parameters whose values are logged: the API's own, none of them secret. Any other
# parameter is logged as `name=(hidden)`. Add a name here only if its value is never a secret.
LOGGED_QUERY_PARAMETERS = frozenset({
    "group", "name", "version", "path", "prefix", "mediaType", "filename",
    "limit", "cursor", "after", "historyLimit", "force", "kind", "status",
    "next", "notice", "problem",
})
# How a request ended: its response written in full, cut by the server (a lost lease, a
# client that took nothing for ARKVORY_SEND_TIMEOUT_SECONDS, a refused head behind it, a stop),
# the client gone first, or the app ended without finishing it (its error is logged).
COMPLETE, CUT, CLIENT_LEFT, INCOMPLETE = "complete", "cut", "client_left", "incomplete"
# Exchange.end of a request whose line the edge writes itself (a malformed body answered 400).
REFUSED = "refused"

log = logging.getLogger("arkvory.http")


def note_principal(scope: Scope, principal_id: str) -> None:
    """Say who asks, for the access line (called where a request's credential is resolved)."""
    scope[PRINCIPAL_KEY] = principal_id


class AccessLog(Collector):
    """The queue, its writer thread and the dropped lines' counter (a Prometheus collector:
    registered on every process whatever the mode, so the series is there at 0 from the start)."""

    def __init__(
        self,
        mode: str,
        trusted: tuple[Network, ...] = (),
        *,
        logger: logging.Logger | None = None,
        capacity: int = QUEUE_LINES,
        write_every_s: float = WRITE_EVERY_S,
    ) -> None:
        if mode not in ("off", "text", "json"):
            raise ValueError(f"mode: expected off, text or json, got {mode!r}")
        self.mode = mode
        self.trusted = trusted
        self.logger = logger or logging.getLogger(ACCESS_LOGGER)
        self.capacity = capacity
        self.write_every_s = write_every_s
        self.dropped = 0  # counted on the serving loop only
        # A deque, not a queue.Queue: the loop appends (atomic, no lock, no wake-up), the thread
        # takes from the other end; `capacity` is held by the loop's own length check.
        self._lines: collections.deque[tuple] = collections.deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    # -- the serving loop's side: cheap, never blocks -----------------------------------------

    def request_ended(self, exchange: Exchange) -> None:
        """`exchange`'s app has returned (protocol.exchange_ended)."""
        lines = self._lines
        if len(lines) >= self.capacity:
            self.dropped += 1
            return
        end = exchange.end
        if end is None:
            end = COMPLETE if exchange.response_complete else CLIENT_LEFT if exchange.disconnected else INCOMPLETE
        elif end == REFUSED:
            return  # the edge's own 400 has its line (`refused`)
        scope = exchange.scope
        range_ = forwarded = None
        for name, value in scope["headers"]:
            if name == b"range":
                range_ = value
            elif name == b"x-forwarded-for":
                forwarded = value if forwarded is None else forwarded + b"," + value
        path = scope["raw_path"]
        query = scope["query_string"]
        lines.append((
            time.time(), time.monotonic() - exchange.began, scope["client"], forwarded,
            scope.get(PRINCIPAL_KEY), scope["method"], scope.get("route"),
            path if len(path) <= FIELD_BYTES else path[:FIELD_BYTES],
            query if len(query) <= FIELD_BYTES else query[:FIELD_BYTES],
            exchange.status, exchange.sent, exchange.received, scope.get(REQUEST_ID_KEY), range_, end,
        ))

    def refused(
        self,
        status: int,
        request_id: str,
        body_bytes: int,
        peer: tuple[str, int] | None,
        began: float | None,
        exchange: Exchange | None = None,
    ) -> None:
        """An answer of the edge's own (400, 431) to a request no app saw, or whose app's line is
        not written (`exchange.end` REFUSED): what is known of it."""
        lines = self._lines
        if len(lines) >= self.capacity:
            self.dropped += 1
            return
        duration = 0.0 if began is None else time.monotonic() - began
        method = route = principal = range_ = None
        path = query = b""
        received = 0
        if exchange is not None:
            scope = exchange.scope
            method, route, principal = scope["method"], scope.get("route"), scope.get(PRINCIPAL_KEY)
            path, query = scope["raw_path"][:FIELD_BYTES], scope["query_string"][:FIELD_BYTES]
            received = exchange.received
        lines.append((
            time.time(), duration, peer, None, principal, method, route, path, query,
            status, body_bytes, received, request_id, range_, COMPLETE,
        ))

    # -- the thread's side -----------------------------------------------------------------

    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="arkvory access log", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 1.0) -> None:
        """Write what is queued and end the thread (waits up to `timeout`: a handler that hangs
        keeps its lines, and the daemon thread ends with the process)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.write_every_s):
            self._write_out()
        self._write_out()

    def _write_out(self) -> None:
        lines = self._lines
        handle = self.logger.handle
        while lines:
            item = lines.popleft()
            try:
                record = self._record(item)
            except Exception:  # a bug here must not end the thread: every later line would queue
                log.exception("could not make an access log line")
                continue
            handle(record)  # (a handler's own failure goes to its handleError)

    def _record(self, item: tuple) -> logging.LogRecord:
        fields = self.fields(item)
        if self.mode == "json":
            message = f"{fields['method']} {fields['path']} {fields['status']}"
        else:
            message = " ".join(f"{name}={_logfmt(value)}" for name, value in fields.items())
        record = logging.LogRecord(self.logger.name, logging.INFO, __file__, 0, message, None, None)
        ended = item[0]
        record.created = ended
        record.msecs = int((ended - int(ended)) * 1000) + 0.0
        record.fields = fields  # (JsonFormatter's keys; any handler an operator adds may read them)
        return record

    def fields(self, item: tuple) -> dict[str, Any]:
        """A queued tuple as the line's named fields, in the order a text line shows them."""
        (_, duration, peer, forwarded, principal, method, route, path, query,
         status, sent, received, rid, range_, end) = item
        forwarded_for = [forwarded.decode("latin-1")] if forwarded else []
        if route is None:
            template = "-" if method is None else "unmatched"
        else:
            template = getattr(route, "path", None) or "unmatched"
        shown = path.decode("latin-1") if path else "-"
        if query:
            shown += "?" + _logged_query(query.decode("latin-1"))
        return {
            "client": address_of(peer[0] if peer else None, forwarded_for, self.trusted),
            "principal": principal or ANONYMOUS,
            "method": method or "-",
            "route": template,
            "path": shown,
            "status": status,
            "bytes_sent": sent,
            "bytes_received": received,
            "duration_ms": round(duration * 1000, 3),
            "request_id": rid or "-",
            "range": None if range_ is None else range_[:FIELD_BYTES].decode("latin-1"),
            "end": end,
        }

    # -- the metric ------------------------------------------------------------------------

    def collect(self):
        yield CounterMetricFamily(
            "arkvory_access_log_dropped_lines",
            "Access log lines dropped because the thread that writes them fell behind (a slow "
            "stderr or journal); requests never wait for it",
            value=self.dropped,
        )


def _logged_query(query: str) -> str:
    """The query string with every parameter not in LOGGED_QUERY_PARAMETERS (name and value:
    either could be what a client should not have sent) shown as `(hidden)`."""
    return "&".join(
        piece if piece.partition("=")[0] in LOGGED_QUERY_PARAMETERS else "(hidden)"
        for piece in query.split("&")
    )


_PLAIN = re.compile(r"[A-Za-z0-9._:/@%+,;*{}()?&~!$'\[\]-]+")


def _logfmt(value: Any) -> str:
    """A value as logfmt writes it: bare when it is plain, else quoted with JSON's escapes, so
    that nothing a client sent (a CR, a quote, a space) can split or forge a line."""
    if value is None:
        return "-"
    text = str(value)
    if _PLAIN.fullmatch(text):
        return text
    return json.dumps(text)
