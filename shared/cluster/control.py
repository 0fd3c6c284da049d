"""The process's control connection, supervised: it holds the writer lock (writer) or the shared
maintenance lock (gateway), LISTENs on the channels its owner subscribes to, and runs its owner's
per-ping hooks. The composition root (shared/process/runtime.py) subscribes the catalog cache,
the credential cache and the reused blob descriptors, and hooks the batched last-used times of
credentials onto the ping: this module knows none of them.

A session-level advisory lock and a LISTEN live only as long as their backend, so a lost
connection silently loses both. `run` pings every 2 s with a timeout (a half-open connection
answers nothing), and on loss reconnects, re-takes the lock, re-LISTENs and tells every
subscriber, which flushes what it remembered; the caches answer nothing in between. A writer
that finds its lock taken by another writer meanwhile must not go on: `run` raises
StartupRefused (exit 78), as at start-up. Pings and reconnection attempts report to
`supervision.DATABASE`: an outage is one line, not one per retry.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import anyio
import asyncpg

from arkvory.shared import db
from arkvory.shared.errors import DatabaseUnavailable, StartupRefused

from .supervision import DATABASE

log = logging.getLogger("arkvory.control")

PING_EVERY_S = 2.0
PING_TIMEOUT_S = 1.5
RECONNECT_EVERY_S = 1.0
# A half-open old backend of ours may still hold the writer lock; we end it and wait this long.
OWN_BACKEND_WAIT_S = 5.0
CLOSE_TIMEOUT_S = 2.0
LOOP = "control connection"  # as named in the process's database outage lines

Lock = Literal["writer", "maintenance"]

_LOCK_HOLDER = """
SELECT pid FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 1
  AND classid = ($1::bigint >> 32)::oid AND objid = ($1::bigint & 4294967295)::oid
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""

# What a per-ping hook does with the connection, within the given timeout (seconds).
PingHook = Callable[[asyncpg.Connection, float], Awaitable[Any]]


def _nothing() -> None:
    pass


@dataclasses.dataclass(frozen=True)
class Subscription:
    """One channel this connection LISTENs on, and who hears of it."""

    channel: str
    on_notify: Callable[[str], None]  # the notification's payload
    # After every LISTEN (the first and each one after a reconnection): whatever a missed
    # notification could have made stale must go.
    on_listening: Callable[[], None] = _nothing
    # The connection is lost or closing: nothing may be trusted on this channel's word until
    # `on_listening` again.
    on_deaf: Callable[[], None] = _nothing

    def _listener(self, conn: object, pid: int, channel: str, payload: str) -> None:
        self.on_notify(payload)


class ControlConnection:
    def __init__(self, database_url: str, role: str) -> None:
        self.database_url = database_url
        self.application_name = f"arkvory-{role}-control"
        self.subscriptions: list[Subscription] = []
        self.ping_hooks: list[tuple[str, PingHook]] = []
        self.lock: Lock | None = None
        self.reconnects = 0
        self._conn: asyncpg.Connection | None = None
        self._gone = asyncio.Event()
        self._closing = False

    def subscribe(
        self,
        channel: str,
        on_notify: Callable[[str], None],
        *,
        on_listening: Callable[[], None] = _nothing,
        on_deaf: Callable[[], None] = _nothing,
    ) -> None:
        """LISTEN on `channel` from the next `listen` on; subscribe before it."""
        self.subscriptions.append(Subscription(channel, on_notify, on_listening, on_deaf))

    def every_ping(self, what: str, hook: PingHook) -> None:
        """Run `hook(conn, timeout)` after each good ping. Its failure is logged ("could not
        <what>") and dropped: bookkeeping, never a loss of the connection by itself (the next
        ping decides that)."""
        self.ping_hooks.append((what, hook))

    @property
    def conn(self) -> asyncpg.Connection:
        assert self._conn is not None, "open() first"
        return self._conn

    async def open(self) -> asyncpg.Connection:
        self._conn = await db.connect(
            self.database_url, server_settings={"application_name": self.application_name}
        )
        self._gone.clear()
        self._conn.add_termination_listener(self._on_terminated)
        return self._conn

    async def take_lock(self, lock: Lock, *, previous_backend: int | None = None) -> None:
        """Take `lock` on this connection for the rest of its life, or refuse (exit 78)."""
        conn = self.conn
        if lock == "maintenance":
            if not await conn.fetchval(
                "SELECT pg_try_advisory_lock_shared($1)", db.MAINTENANCE_LOCK, timeout=db.QUERY_TIMEOUT_S
            ):
                raise StartupRefused("an offline repair tool holds the maintenance lock; try later")
            self.lock = lock
            return
        deadline = time.monotonic() + OWN_BACKEND_WAIT_S
        while not await conn.fetchval(
            "SELECT pg_try_advisory_lock($1)", db.WRITER_LOCK, timeout=db.QUERY_TIMEOUT_S
        ):
            holder = await conn.fetchval(_LOCK_HOLDER, db.WRITER_LOCK, timeout=db.QUERY_TIMEOUT_S)
            if previous_backend is None or holder != previous_backend or time.monotonic() > deadline:
                raise StartupRefused(
                    "another Arkvory writer is already running against this database "
                    "(only one writer per database)"
                )
            # Our own old backend, cut off but not yet noticed by the server, still holds it.
            await conn.execute("SELECT pg_terminate_backend($1)", holder, timeout=db.QUERY_TIMEOUT_S)
            await asyncio.sleep(0.1)
        self.lock = lock

    async def listen(self) -> None:
        """LISTEN on every subscribed channel, telling each subscriber once its LISTEN holds."""
        for subscription in self.subscriptions:
            await self.conn.add_listener(subscription.channel, subscription._listener)
            subscription.on_listening()

    def _stop_listening(self) -> None:
        for subscription in self.subscriptions:
            subscription.on_deaf()

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Keep the connection, its lock and its LISTEN alive until cancelled."""
        task_status.started()
        while True:
            reason = await self._until_lost()
            # While the process is stopping on purpose the database may be stopping too.
            log.log(
                logging.INFO if self._closing else logging.WARNING,
                "control connection lost (%s): reconnecting; catalog lookups are not cached until then",
                reason,
            )
            previous_backend = self._drop()
            await self._reconnect(previous_backend)
            self.reconnects += 1
            log.info("control connection restored: %s lock held, listening again", self.lock or "no")

    async def _until_lost(self) -> str:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._gone.wait(), PING_EVERY_S)
            conn = self._conn
            if self._gone.is_set() or conn is None or conn.is_closed():
                return "the connection closed"
            try:
                await conn.fetchval("SELECT 1", timeout=PING_TIMEOUT_S)
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                DATABASE.failed(LOOP, exc)
                return f"ping failed: {exc.__class__.__name__}: {exc}"
            DATABASE.succeeded(LOOP)
            await self._run_ping_hooks(conn)

    async def _run_ping_hooks(self, conn: asyncpg.Connection) -> None:
        for what, hook in self.ping_hooks:
            try:
                await hook(conn, PING_TIMEOUT_S)
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log.warning("could not %s: %s: %s", what, exc.__class__.__name__, exc)

    async def _reconnect(self, previous_backend: int | None) -> None:
        while True:
            try:
                await self.open()
                if self.lock is not None:
                    await self.take_lock(self.lock, previous_backend=previous_backend)
                await self.listen()
                DATABASE.succeeded(LOOP)
                return
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, DatabaseUnavailable) as exc:
                DATABASE.failed(LOOP, exc)  # logged once per outage, each attempt at debug
                self._drop()
                await asyncio.sleep(RECONNECT_EVERY_S)

    def _on_terminated(self, conn: object) -> None:
        # Called by asyncpg when the backend goes away; a planned close detaches first.
        self._stop_listening()
        self._gone.set()

    def _drop(self) -> int | None:
        """Forget the current connection without waiting on it; returns its backend pid."""
        self._stop_listening()
        conn, self._conn = self._conn, None
        if conn is None:
            return None
        pid = conn.get_server_pid()
        conn.remove_termination_listener(self._on_terminated)
        conn.terminate()
        return pid

    def stopping(self) -> None:
        """The process stops on purpose (drain): a loss from now on is no news."""
        self._closing = True

    async def close(self, *, wait: bool = True) -> None:
        """Planned stop: not a loss, so nothing is logged as one."""
        self._closing = True
        self._stop_listening()
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn.remove_termination_listener(self._on_terminated)
        if not wait:
            conn.terminate()
            return
        try:
            await asyncio.wait_for(conn.close(), CLOSE_TIMEOUT_S)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
            conn.terminate()
