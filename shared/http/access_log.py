"""The access log (ARKVORY_ACCESS_LOG=text|json): one line per request, written off the serving path.

At the end of every request the edge (protocol.py, the one place that sees them all, its own
400/431/500 answers and cut downloads included) hands over what it knows as a tuple: a few
attribute reads and one pass over the headers for `Range` and `X-Forwarded-For`, no formatting,
no lock, no wake-up. The tuples wait in a bounded queue. Every WRITE_EVERY_S a timer of the
serving loop, between requests, writes them as lines (text or JSON, in the shapes of logs.py's
formats) and hands the batch to a thread of its own, which gives it, whole lines, as one record
to the logger `arkvory.access`; its handler (logs.configure) writes it to stderr in one call.
A slow stderr or journal thus holds up that thread only: the next batch is written once the
thread has taken the one before, the tuples wait meanwhile, and once the queue is full a line
is dropped and counted in `arkvory_access_log_dropped_lines_total`; a request never waits.

Why the lines are made on the loop and not in the thread (bench/small_requests.py --access-log,
the 64 KiB download at ~55 µs of gateway CPU, issue 24's goal ≥ 0.9 of its rate): CPython runs
one thread at a time, and a thread that computes while the loop serves takes the interpreter
at each of the loop's system calls and keeps it for up to a switch interval. Made in the
thread, a record per line with logging's formatter cost ~17 µs a line and 0.62 of the rate;
made in the thread in batches, ~3 µs a line but +15 µs of CPU per request in lock hand-overs
(0.84), as measured while it was built. Made on the loop in batches, one f-string a
line with what repeats from line to line written once (`_head`) and the time once a second, it
costs ~27 k user-space instructions a text line (~31 k JSON, request_ended's share ~11 k) beside
~196 k for the download itself (callgrind; docs/performance.md, "Issue 24 §4 access log").

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

import asyncio
import collections
import json
import logging
import queue
import re
import threading
import time

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector
from starlette.types import Scope

from arkvory.shared.logs import ACCESS_LOGGER

from .client_address import Network, address_of
from .exchange import Exchange
from .refusals import REQUEST_ID_KEY

# Where the principal's id is kept in a request's scope (`note_principal`): a string, not the
# Principal the writer's routes keep under "arkvory.principal" (writer/request_inputs.PRINCIPAL_KEY).
PRINCIPAL_ID_KEY = "arkvory.principal_id"
ANONYMOUS = "anonymous"
UNMATCHED = "unmatched"  # the route of a request no route matched (as in the metrics)
# A few seconds of a busy process's requests (issue 6: ~5 k small requests/s per process).
QUEUE_LINES = 16384
WRITE_EVERY_S = 0.1  # how long a line waits, at most, before it is written
BATCH_LINES = 1024  # lines of one record (one write); ~2 ms of the loop's time to make them
# Bytes kept of a client-chosen field (path, query, Range, X-Forwarded-For): bounds both the
# queue's memory and the line, whatever head (up to 64 KiB) the client sent.
FIELD_BYTES = 512
_CLIENTS_KEPT = 4096  # believed addresses remembered (then it starts over)
# Lines' written heads remembered (then it starts over): at most ~3 KiB each (a path of
# FIELD_BYTES past ASCII, escaped), so a few MiB.
_HEADS_KEPT = 1024
# Query parameters whose values are logged: the API's own, none of them secret. Any other
# parameter is logged as `(hidden)`. Add a name here only if its value is never a secret.
# (tests/test_access_log.py holds it to every parameter the API's routes declare.)
LOGGED_QUERY_PARAMETERS = frozenset({
    "group", "name", "version", "path", "prefix", "mediaType", "filename", "sha256",
    "limit", "cursor", "after", "order", "historyLimit", "force", "kind", "status",
    "keepNewest", "keepYoungerThanSeconds",
    "action", "outcome", "principal", "repository", "target", "since", "until",
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
    scope[PRINCIPAL_ID_KEY] = principal_id


class AccessLog(Collector):
    """The queue, the timer that makes lines, the thread that writes them, and the dropped
    lines' counter (a Prometheus collector: registered on every process whatever the mode, so
    the series is there at 0 from the start)."""

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
        # The requests' values, on the loop only: no lock; `capacity` is its length's bound.
        self._lines: collections.deque[tuple] = collections.deque()
        # Batches of lines for the thread; as many handed as written: it keeps up.
        self._batches: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._handed = 0  # (counted by the loop only)
        self._written = 0  # (counted by the thread only)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        # What making lines remembers: believed addresses by (host, X-Forwarded-For), the heads
        # of lines as written (`_head`), the time of the current second.
        self._clients: dict[tuple, str] = {}
        self._heads: dict[tuple, str | tuple[str, str]] = {}
        self._escape = _json if mode == "json" else _logfmt
        self._second = (-1, "")
        self._name = self.logger.name
        self._logger_name = json.dumps(self.logger.name)

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
        if forwarded is not None and len(forwarded) > FIELD_BYTES:
            forwarded = forwarded[-FIELD_BYTES:]  # its right end is what may be believed
        path = scope["raw_path"]
        query = scope["query_string"]
        # Its template, not the route: a tuple of strings and numbers only is dropped from the
        # garbage collector's lists at its first pass, so the queue never ages into a full
        # collection's work.
        lines.append((
            time.time(), time.monotonic() - exchange.began, scope["client"], forwarded,
            scope.get(PRINCIPAL_ID_KEY), scope["method"], getattr(scope.get("route"), "path", None) or UNMATCHED,
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
            method, principal = scope["method"], scope.get(PRINCIPAL_ID_KEY)
            route = getattr(scope.get("route"), "path", None) or UNMATCHED
            path, query = scope["raw_path"][:FIELD_BYTES], scope["query_string"][:FIELD_BYTES]
            received = exchange.received
        lines.append((
            time.time(), duration, peer, None, principal, method, route, path, query,
            status, body_bytes, received, request_id, range_, COMPLETE,
        ))

    # -- the lines, and the thread that writes them ---------------------------------------

    def start(self) -> None:
        """On the serving loop: its timer that writes the lines, and the writer thread."""
        if not self.enabled or self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._write_batches, name="arkvory access log", daemon=True)
        self._thread.start()
        self._timer = self._loop.call_later(self.write_every_s, self._tick)

    async def close(self, timeout: float = 1.0) -> None:
        """Write what is queued and end the thread, waiting up to `timeout` for it (a handler
        that hangs keeps its lines, and the daemon thread ends with the process)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._lines:
            self._hand_over()
        self._batches.put(None)
        await asyncio.get_running_loop().run_in_executor(None, thread.join, timeout)

    def _tick(self) -> None:
        """Every WRITE_EVERY_S on the serving loop: the queued lines written, a batch at a time,
        once the thread has written the one before (else they wait, and beyond the queue's
        capacity new ones are dropped); at once again while a backlog remains."""
        self._timer = None
        if self._handed > self._written:  # the thread is still writing (or hangs)
            delay = self.write_every_s
        else:
            self._hand_over()
            delay = 0.0 if len(self._lines) >= BATCH_LINES else self.write_every_s
        if self._thread is not None:
            self._timer = self._loop.call_later(delay, self._tick)

    def _hand_over(self) -> None:
        lines, line_of = self._lines, self._line
        batch = []
        for _ in range(min(len(lines), BATCH_LINES)):
            item = lines.popleft()
            try:
                batch.append(line_of(item))
            except Exception:  # a bug here must cost its line only
                log.exception("could not write an access log line")
        if batch:
            self._handed += 1
            self._batches.put("\n".join(batch))

    def _write_batches(self) -> None:
        """The thread: each batch as one record of the access logger (one write, whole lines)."""
        logger = self.logger
        while (batch := self._batches.get()) is not None:
            try:
                logger.handle(logger.makeRecord(logger.name, logging.INFO, __file__, 0, batch, None, None))
            except Exception:  # (handlers report their own failures; this is anything else)
                log.exception("could not hand the access log lines to their handler")
            finally:
                self._written += 1

    def _line(self, item: tuple) -> str:
        """One line, text or JSON: one f-string. What repeats from request to request (who asked
        what, from where: a client fetching one artifact again and again, a balancer's polls) is
        written once and remembered (`_head`); the time once a second."""
        (ended, duration, peer, forwarded, principal, method, template, path, query,
         status, sent, received, rid, range_, end) = item
        key = (peer[0] if peer else None, forwarded, principal, method, template, path, query)
        head = self._heads.get(key)
        if head is None:
            head = self._head(key)
        # Different each time: the request id, the Range asked for.
        escape = self._escape
        rid = escape(rid)
        range_text = escape(None if range_ is None else range_[:FIELD_BYTES].decode("latin-1"))
        second, stamp = self._second
        if int(ended) != second:
            second = int(ended)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S" if self.mode == "json" else "%Y-%m-%d %H:%M:%S", time.localtime(second))
            self._second = (second, stamp)
        ms = int((ended - second) * 1000)
        if self.mode == "json":
            what, fields = head
            return (
                f'{{"time": "{stamp}.{ms:03d}", "level": "info", "logger": {self._logger_name}, '
                f'"message": "{what} {status}", {fields}, "status": {status}, "bytes_sent": {sent}, '
                f'"bytes_received": {received}, "duration_ms": {duration * 1000:.3f}, "request_id": {rid}, '
                f'"range": {range_text}, "end": "{end}"}}'
            )
        return (
            f"{stamp},{ms:03d} INFO {self._name}: {head} status={status} bytes_sent={sent} "
            f"bytes_received={received} duration_ms={duration * 1000:.3f} request_id={rid} range={range_text} end={end}"
        )

    def _head(self, key: tuple) -> str | tuple[str, str]:
        """The client, principal, method, route and path of a line, written (and remembered):
        text's `client=… path=…`, or JSON's message start and its fields."""
        host, forwarded, principal, method, template, path, query = key
        client = self._clients.get((host, forwarded))
        if client is None:
            client = self._client(host, forwarded)
        # None: not known (the edge's own answer to a head it could not read has no method,
        # route or path), written `-` in text and null in JSON.
        shown = path.decode("latin-1") if path else None
        if query:
            shown = (shown or "") + "?" + _logged_query(query.decode("latin-1"))
        escape = self._escape
        client, principal, template = escape(client), escape(principal or ANONYMOUS), escape(template)
        method_text, shown_text = escape(method), escape(shown)
        if self.mode == "json":
            what = f"{'-' if method is None else method_text[1:-1]} {'-' if shown is None else shown_text[1:-1]}"
            head = (what, f'"client": {client}, "principal": {principal}, "method": {method_text}, '
                          f'"route": {template}, "path": {shown_text}')
        else:
            head = f"client={client} principal={principal} method={method_text} route={template} path={shown_text}"
        if len(self._heads) >= _HEADS_KEPT:
            self._heads.clear()
        self._heads[key] = head
        return head

    def _client(self, host: str | None, forwarded: bytes | None) -> str:
        """The believed address (remembered: a balancer's few addresses, or a client's, come
        again and again; client_address.address_of parses each hop)."""
        client = address_of(host, [forwarded.decode("latin-1")] if forwarded else [], self.trusted)
        if len(self._clients) >= _CLIENTS_KEPT:
            self._clients.clear()
        self._clients[(host, forwarded)] = client
        return client

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


# What a value may hold and still be written as it is: in logfmt bare (no space, quote, `=` or
# control character), inside a JSON string (no quote, backslash, control or non-ASCII character).
_LOGFMT_PLAIN = re.compile(r"[A-Za-z0-9._:/@%+,;*{}()?&~!$'\[\]-]+").fullmatch
_JSON_PLAIN = re.compile(r'[ !#-\[\]-~]*').fullmatch


def _logfmt(text: str | None) -> str:
    """A value as logfmt writes it: bare when it is plain, else quoted with JSON's escapes, so
    that nothing a client sent (a CR, a quote, a space) can split or forge a line; `-` when
    not known (a value that is `-` itself is quoted)."""
    if text is None:
        return "-"
    return text if text != "-" and _LOGFMT_PLAIN(text) else json.dumps(text)


def _json(text: str | None) -> str:
    """A JSON string (null when not known)."""
    if text is None:
        return "null"
    return f'"{text}"' if _JSON_PLAIN(text) else json.dumps(text)
