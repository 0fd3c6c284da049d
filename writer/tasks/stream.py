"""Live task event streams (`text/event-stream`): one LISTEN per writer, fanned out in memory.

Every event insert NOTIFYs channel `arkvory_tasks` with "<task id> <seq> <type>" (migration
0007). `TaskEventHub` holds the writer's one dedicated connection that LISTENs on it, and wakes
the streams that follow that task; a stream never holds a database connection while it waits
(it borrows a pool connection for each short read), so a thousand followers cost one backend.

Why no event can be lost or sent twice: a NOTIFY is only a hint. A stream clears its wake-up
flag *before* it reads the table, sends what it read in `seq` order from the last number it
sent, and only then waits; a notification that arrives during the read sets the flag again.
A NOTIFY can still be missed (the listener connection was down): the hub wakes every stream
after each (re)connection, and every stream re-reads at least every `POLL_S` anyway, so a lost
notification delays an event by a few seconds and never hangs a stream.

A stream ends when the task is finished and every one of its events was sent, when the task is
gone (pruned), after `MAX_STREAM_S` (the client reconnects with `Last-Event-ID`), when the
writer drains (SIGTERM), or when the database fails mid-stream; it sends a `: keep-alive`
comment after `KEEPALIVE_S` of silence so proxies do not cut it. At most `MAX_STREAMS` run at
once per writer; beyond that a new one gets 503 `busy` with Retry-After.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import asyncpg
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from arkvory.shared import db
from arkvory.shared.cluster.supervision import DATABASE
from arkvory.shared.errors import Busy, DatabaseUnavailable

from . import store

log = logging.getLogger("arkvory.tasks.stream")

CHANNEL = "arkvory_tasks"
MAX_STREAMS = 64
POLL_S = 3.0
KEEPALIVE_S = 15.0
MAX_STREAM_S = 3600.0
BATCH = 500  # events read per query; a long backlog is sent in several reads
RETRY_MS = 2000  # the reconnection delay an EventSource client should use
PING_EVERY_S = 2.0
PING_TIMEOUT_S = 1.5
RECONNECT_EVERY_S = 1.0
TICK_S = 0.5  # how soon the hub notices a drain
_DATABASE_ERRORS = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, DatabaseUnavailable)
LOOP = "task event listener"  # as named in the process's database outage lines


class Subscription:
    """One stream's interest in one task; `wake` is set by every hint that it may have news."""

    def __init__(self, hub: TaskEventHub, task_id: uuid.UUID) -> None:
        self.hub = hub
        self.task_id = task_id
        self.wake = asyncio.Event()
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.hub._remove(self)


class TaskEventHub:
    """The writer's task-event listener and the streams it wakes."""

    def __init__(
        self,
        database_url: str,
        draining: Callable[[], bool] = lambda: False,
        *,
        max_streams: int = MAX_STREAMS,
    ) -> None:
        self.database_url = database_url
        self.draining = draining
        self.max_streams = max_streams
        self.listening = False
        self.closing = False
        self.reconnects = 0
        self._followers: dict[uuid.UUID, set[Subscription]] = {}
        self._active = 0

    @property
    def active(self) -> int:
        return self._active

    # -- streams ----------------------------------------------------------------------------

    def subscribe(self, task_id: uuid.UUID) -> Subscription:
        """A place for one more stream, or 503 busy (too many, or the writer is stopping).
        The caller must `release()` it, whatever happens."""
        if self.closing or self.draining():
            raise Busy("the writer is stopping; follow the task on the next writer")
        if self._active >= self.max_streams:
            raise Busy(
                f"{self.max_streams} event streams are open on this writer; retry later, "
                "or poll the JSON form of this route"
            )
        subscription = Subscription(self, task_id)
        self._followers.setdefault(task_id, set()).add(subscription)
        self._active += 1
        return subscription

    def _remove(self, subscription: Subscription) -> None:
        followers = self._followers.get(subscription.task_id)
        if followers is not None:
            followers.discard(subscription)
            if not followers:
                del self._followers[subscription.task_id]
        self._active -= 1

    def wake_all(self) -> None:
        for followers in self._followers.values():
            for subscription in followers:
                subscription.wake.set()

    def close(self) -> None:
        """End every stream (drain): each sends what it has and stops at its next wake-up."""
        self.closing = True
        self.wake_all()

    def _on_notify(self, conn: object, pid: int, channel: str, payload: str) -> None:
        try:
            task_id = uuid.UUID(payload.split(" ", 1)[0])
        except ValueError:
            return
        for subscription in self._followers.get(task_id, ()):
            subscription.wake.set()

    # -- the listener connection ------------------------------------------------------------

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep one LISTEN connection until cancelled (or drained); a database outage is
        logged once, and the streams fall back on polling until the connection is back. Started
        at once: streams work without the listener (by polling), so it never delays start-up."""
        task_status.started()
        outage_logged = False
        while not self.closing:
            conn: asyncpg.Connection | None = None
            try:
                conn = await db.connect(
                    self.database_url, server_settings={"application_name": "arkvory-api-task-events"}
                )
                gone = asyncio.Event()
                conn.add_termination_listener(lambda _conn: gone.set())
                await conn.add_listener(CHANNEL, self._on_notify)
                DATABASE.succeeded(LOOP)
                self.listening = True
                # Whatever was notified while nobody listened: every stream reads again.
                self.wake_all()
                if outage_logged:
                    self.reconnects += 1
                    log.info("task event listener restored")
                    outage_logged = False
                reason = await self._until_lost(conn, gone)
            except _DATABASE_ERRORS as exc:
                DATABASE.failed(LOOP, exc)  # one line per outage for the process
                reason = f"{exc.__class__.__name__}: {exc}"
            finally:
                self.listening = False
                if conn is not None:
                    conn.terminate()
            if self.closing:
                return
            if not outage_logged:
                log.warning("task event listener lost (%s): streams poll until it is back", reason)
                outage_logged = True
            await self._pause(RECONNECT_EVERY_S)

    async def _until_lost(self, conn: asyncpg.Connection, gone: asyncio.Event) -> str:
        next_ping = time.monotonic() + PING_EVERY_S
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(gone.wait(), TICK_S)
            if gone.is_set() or conn.is_closed():
                return "the connection closed"
            self._watch_drain()
            if self.closing:
                return "draining"
            if time.monotonic() >= next_ping:
                # A half-open connection delivers no NOTIFY and raises nothing: ask it.
                await conn.fetchval("SELECT 1", timeout=PING_TIMEOUT_S)
                next_ping = time.monotonic() + PING_EVERY_S

    async def _pause(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.closing:
            await asyncio.sleep(min(TICK_S, max(0.0, deadline - time.monotonic())))
            self._watch_drain()

    def _watch_drain(self) -> None:
        if not self.closing and self.draining():
            self.close()


# -- one stream -------------------------------------------------------------------------------


def event_json(event: dict[str, Any]) -> dict[str, Any]:
    return {
        "seq": event["seq"],
        "type": event["type"],
        "data": event["data"],
        "created_at": event["created_at"].isoformat(),
    }


def sse_frame(event: dict[str, Any]) -> bytes:
    body = json.dumps(event_json(event), separators=(",", ":"))  # one line: no raw newline
    kind = event["type"].replace("\r", " ").replace("\n", " ")
    return f"id: {event['seq']}\nevent: {kind}\ndata: {body}\n\n".encode()


async def frames(
    pool: asyncpg.Pool,
    subscription: Subscription,
    after: int,
    *,
    poll_s: float = POLL_S,
    keepalive_s: float = KEEPALIVE_S,
    max_s: float = MAX_STREAM_S,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[bytes]:
    """The stream's bytes: the events after `after`, then live ones until the task ends."""
    hub, task_id = subscription.hub, subscription.task_id
    started = last_write = clock()
    yield f"retry: {RETRY_MS}\n\n".encode()
    sent = after
    while True:
        subscription.wake.clear()  # before the read: a hint during it is not lost
        try:
            async with db.pooled(pool) as conn:
                state = await conn.fetchrow(
                    "SELECT status, last_event FROM arkvory_tasks WHERE id = $1", task_id, timeout=db.QUERY_TIMEOUT_S
                )
                events = await store.fetch_events(conn, task_id, sent, BATCH) if state is not None else []
        except _DATABASE_ERRORS as exc:
            log.warning("task event stream of %s ends: the database failed: %s", task_id, exc.__class__.__name__)
            yield b": the database failed; reconnect with Last-Event-ID\n\n"
            return
        if events:
            yield b"".join(sse_frame(event) for event in events)
            sent = events[-1]["seq"]
            last_write = clock()
            if len(events) == BATCH:
                continue  # more backlog: no wait
        if state is None:
            return  # pruned: nothing more will come
        if state["status"] in store.FINISHED and sent >= state["last_event"]:
            return  # every event of a finished task was sent
        if hub.closing or clock() - started >= max_s:
            return
        quiet = keepalive_s - (clock() - last_write)
        if quiet <= 0:
            yield b": keep-alive\n\n"
            last_write = clock()
            quiet = keepalive_s
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(subscription.wake.wait(), min(poll_s, quiet))


class EventStreamResponse(StreamingResponse):
    """A `text/event-stream` that gives its hub place back however the response ends, even
    when the client left before the first byte (the body generator then never runs)."""

    def __init__(self, body: AsyncIterator[bytes], subscription: Subscription, headers: dict[str, str]) -> None:
        super().__init__(
            body,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no", **headers},
        )
        self.subscription = subscription

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.subscription.release()
