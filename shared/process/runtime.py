"""One running Arkvory process: start-up checks, the resources it owns, and its health state.

This is the composition root: the runtime builds the parts (pool, control connection, lease,
pins, caches, storage, admission and buckets) and wires them together, e.g. it subscribes the
caches to the control connection. Lower packages take the parts they need, or a narrow protocol
of them (download/serving.py), never the Runtime itself.

`Runtime.start` does everything that may refuse the start (settings are already valid): the
database, the writer lock or the gateway's maintenance lock, migrations or the schema check,
storage identity (a directory or an object store: shared/storage/opening.py), the download policy
and the slot lease. Only then does the server bind its
port, so a process that cannot serve never accepts a connection.

The lease renews in its own thread from the moment it is acquired (shared/cluster/lease.py). The
other background loops (read pins, the lease watcher, the control connection) run supervised on
the serving loop (shared/cluster/supervision.py): whatever ends one of them unexpectedly stops
serving at once and exits 75 (78 when another writer took the writer lock), never a silently
dead task. `payload_allowed()` is the one cheap answer the streaming code asks before every
chunk.

With an object store, a probe loop (shared/storage/health.py) says whether it answers: while it
does not, the process is `degraded`: it keeps its lease and its place in the balancer
(`/health/status` 200), serves its read cache and everything that needs no store, answers what
needs the store with its own 503 `unavailable` and Retry-After (a balancer's bare 503 would
carry neither), and is `ready` again by itself once the store answers.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
from typing import Any

import anyio
import asyncpg
from prometheus_client import CollectorRegistry

from arkvory.shared import db
from arkvory.shared.auth.credentials import CredentialCache
from arkvory.shared.auth.identity import KeyRing
from arkvory.shared.cluster import control as control_loop, lease as lease_loop, pins as pins_loop, policy
from arkvory.shared.cluster.control import ControlConnection
from arkvory.shared.cluster.grants import ShareExchange
from arkvory.shared.cluster.lease import SlotLease
from arkvory.shared.cluster.lease_history import LeaseHistory, record_payload_after_trust
from arkvory.shared.cluster.pins import ReadPins
from arkvory.shared.cluster.replication import ReplicationWatch
from arkvory.shared.cluster.supervision import DATABASE, observe_database, supervised
from arkvory.shared.cluster.transfers import Transfers
from arkvory.shared.download.admission import Admission
from arkvory.shared.download.catalog_cache import CatalogCache
from arkvory.shared.download.demand import WANTED_CHANNEL, DemandShares, observe_shares
from arkvory.shared.download.throttle import BandwidthScheduler
from arkvory.shared.errors import DatabaseUnavailable, LeaseLost, StartupError, StartupRefused
from arkvory.shared.metrics import Metrics
from arkvory.shared.settings import Settings
from arkvory.shared.storage import BlobStorage, StorageHealth, open_blobs, open_storage
from arkvory.shared.storage.free_space import FreeSpace
from arkvory.shared.storage.upload_files import sweep_at_start

log = logging.getLogger("arkvory.runtime")

EXIT_LEASE_LOST = 75  # EX_TEMPFAIL: the service manager restarts us, we wait for the slot
LOST_DRAIN_S = 2.0  # keep answering 503 `unavailable` this long before exiting
IN_POOL = ("ready", "degraded")  # the states /health/status answers 200: the balancer keeps us


class Runtime:
    def __init__(self, settings: Settings, keys: KeyRing, registry: CollectorRegistry | None = None):
        self.settings = settings
        self.keys = keys
        self.registry = registry or CollectorRegistry()
        self.metrics = Metrics(self.registry)
        observe_database(self.registry)  # every loop of this process reports its database attempts there
        self.control: ControlConnection | None = None
        self.pool: asyncpg.Pool | None = None
        self.storage: BlobStorage | None = None
        self.storage_health = StorageHealth()
        self.hostname = socket.gethostname()
        self.lease: SlotLease | None = None
        self.schema_version: int | None = None
        self.schema_too_new = False
        self.draining = False
        self.exit_status = 0
        # More supervised loops of the assembled program, as (name, run): the writer's task
        # schedule. Added before `start_background`.
        self.extra_loops: list[tuple[str, Any]] = []
        # Why this process stopped serving for good (lease lost, a background loop failed).
        self.failure: str | None = None
        self._server_stop: asyncio.Event | None = None
        self.bandwidth = BandwidthScheduler(
            settings.process_bytes_per_second, settings.principal_bytes_per_second
        )
        self.admission = Admission(
            settings.max_downloads,
            settings.max_downloads_per_principal,
            settings.download_queue_size,
            settings.download_queue_timeout_ms / 1000,
        )
        self.pins = ReadPins(slot=settings.slot)
        self.transfers = Transfers()
        # Both caches are trusted only while the control connection LISTENs (`_subscribe`).
        self.catalog = CatalogCache()
        self.credentials = CredentialCache()
        # Every slot's lease as the database knows it: a lost lease is reported by whoever
        # survives it (shared/cluster/lease_history.py).
        self.lease_history = LeaseHistory()
        self.registry.register(self.lease_history)
        # Whether the database has a synchronous standby (readiness `database`).
        self.replication = ReplicationWatch()
        self._publish_configured_shares()
        # Demand mode: shares follow the demand (shared/cluster/grants.py), from the floor on.
        self.demand: DemandShares | None = None
        shared = settings.shared
        if shared is not None and shared.share_mode == "demand":
            exchange = ShareExchange(
                shared.total_bytes_per_second, shared.per_principal_bytes_per_second, shared.slots,
                local_limit=settings.download_bytes_per_second,
                local_principal_limit=settings.download_bytes_per_second_per_principal,
            )
            self.demand = DemandShares(exchange, self.bandwidth, self.admission, self.metrics)
        elif shared is not None:
            observe_shares(self.metrics, shared.total_bytes_per_second, lambda: 0, lambda: 0)

    # -- start-up ---------------------------------------------------------------------------

    @classmethod
    async def start(cls, settings: Settings, keys: KeyRing) -> Runtime:
        runtime = cls(settings, keys)
        try:
            await runtime._start()
        except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
            await runtime.close()
            raise DatabaseUnavailable(
                f"the database failed during start-up: {exc.__class__.__name__}: {exc}"
            ) from exc
        except BaseException:
            await runtime.close()
            raise
        return runtime

    async def _start(self) -> None:
        settings = self.settings
        self.control = ControlConnection(settings.database_url, settings.role)
        self._subscribe(self.control)
        await self.control.open()
        await self.replication.at_start(self.control.conn)  # warns once if a failover could lose renewals
        if settings.is_writer:
            await self._start_writer(self.control.conn)
        else:
            await self._start_gateway(self.control.conn)
        shared = settings.shared
        if shared is not None and not self.schema_too_new:
            self.lease = SlotLease(
                settings.database_url,
                shared.slot,
                settings.role,
                (shared.slots, shared.total_bytes_per_second, shared.per_principal_bytes_per_second),
                report=self.metrics,
                url=advertised_url(settings),
                share_mode=shared.share_mode,
                shares=self.demand.exchange if self.demand is not None else None,
            )
            if self.demand is not None:
                self.demand.attach(self.lease, asyncio.get_running_loop())
            # Renewing starts here, in its own thread: the rest of the start-up cannot delay it.
            await self.lease.start()
        self.pool = await db.create_pool(settings)
        await self.control.listen()
        self.registry.register(FreeSpace.of(self.storage, settings.is_writer, settings.min_free_bytes))

    async def _start_writer(self, control: asyncpg.Connection) -> None:
        assert self.control is not None
        await self.control.take_lock("writer")
        self.schema_version, self.storage = await prepare_writer_state(control, self.settings)
        self.storage_health.storage = self.storage
        await self._attach_read_cache()
        await policy.save_or_check(control, self.settings.shared)

    async def _start_gateway(self, control: asyncpg.Connection) -> None:
        assert self.control is not None and self.settings.shared is not None
        version = await db.schema_version(control)
        if version is None or version == 0:
            raise StartupRefused(
                "the database has no Arkvory schema yet; a gateway never migrates: "
                "start the writer first"
            )
        self.schema_version = version
        if version < db.CODE_SCHEMA_VERSION:
            raise StartupRefused(
                f"the database schema is version {version}, older than this gateway's "
                f"{db.CODE_SCHEMA_VERSION}: upgrade and start the writer first"
            )
        if version > db.CODE_SCHEMA_VERSION:
            # SPEC §3: report not ready instead of serving; keep running so operators see why.
            self.schema_too_new = True
            log.error(
                "database schema %d is newer than this gateway's %d: not serving; "
                "start the gateway from the new version",
                version,
                db.CODE_SCHEMA_VERSION,
            )
            return
        await self.control.take_lock("maintenance")
        self.storage = await open_storage(control, self.settings, who="a gateway")
        self.storage_health.storage = self.storage
        await self._attach_read_cache()
        await policy.check(control, self.settings.shared)

    async def _attach_read_cache(self) -> None:
        """With an object store and ARKVORY_CACHE_MAX_BYTES > 0: the local read cache in
        ARKVORY_DATA_DIR/cache, rebuilt from the files there (shared/storage/read_cache.py)."""
        storage = self.storage
        if not self.settings.cache_max_bytes or storage is None or storage.kind != "s3":
            return
        from arkvory.shared.storage.read_cache import ReadCache

        reads = self.metrics.storage_reads
        storage.cache = await ReadCache.open(  # type: ignore[attr-defined]
            self.settings.data_dir / "cache", self.settings.cache_max_bytes, storage,
            counted=lambda result: reads.labels(result=result).inc(),
        )
        self.metrics.observe_read_cache(storage.cache)  # type: ignore[attr-defined]

    def _subscribe(self, control: ControlConnection) -> None:
        """What the control connection keeps honest in this process: the caches that a NOTIFY
        flushes, the reused blob descriptors of a quarantined blob, and, once per ping, the
        credentials' batched last-used times."""
        for cache in (self.catalog, self.credentials):
            control.subscribe(
                cache.channel,
                cache.notified,
                on_listening=cache.started_listening,
                on_deaf=cache.stop_listening,
            )
        # A quarantine notified while nobody listened went unheard: every cached descriptor goes.
        control.subscribe(
            open_blobs.CHANNEL, open_blobs.forget_everywhere, on_listening=open_blobs.forget_everywhere
        )
        control.every_ping("record credential last-used times", self.credentials.flush_last_used)
        control.every_ping("read the database's replication", self.replication.refresh)
        if self.demand is not None:  # another slot waits for part of our share
            control.subscribe(WANTED_CHANNEL, self.demand.wanted_back)

    def _publish_configured_shares(self) -> None:
        share = self.metrics.share_bytes_per_second
        share.labels(scope="process").set(self.settings.process_bytes_per_second or 0)
        share.labels(scope="principal").set(self.settings.principal_bytes_per_second or 0)
        self.metrics.lease_trust_remaining.set_function(
            lambda: self.lease.trust_remaining() if self.lease else 0.0
        )
        self.metrics.transfers_active.set_function(lambda: self.admission.active)
        self.metrics.transfers_waiting.set_function(lambda: self.admission.waiting)
        self.metrics.observe_bandwidth(self.bandwidth)
        self.metrics.observe_catalog(self.catalog)
        self.metrics.observe_status(lambda: self.status)
        self.metrics.policy_slots.set(self.settings.shared.slots if self.settings.shared else 0)
        self.metrics.read_pins_write_age.set_function(self.pins.write_age)
        self.metrics.storage_available.set_function(lambda: 1.0 if self.storage_available else 0.0)

    # -- state read by every request --------------------------------------------------------

    def payload_allowed(self) -> bool:
        """May a payload byte be handed out now? Cheap (attribute reads and a clock read),
        correct from any thread and right after a stall: the lease is trusted, read pins are
        written, and no background loop has failed."""
        lease = self.lease
        if lease is not None and not lease.trusted:
            return False
        return self.failure is None and self.pins.healthy

    @property
    def stopping(self) -> bool:
        """On its way out: draining (SIGTERM), or failed (lease lost, a loop stopped)."""
        return self.draining or self.failure is not None

    @property
    def address(self) -> str:
        """Where this process listens (ARKVORY_HOST:ARKVORY_PORT), as its readiness reports it."""
        host = self.settings.host
        return f"[{host}]:{self.settings.port}" if ":" in host else f"{host}:{self.settings.port}"

    @property
    def storage_available(self) -> bool:
        return self.storage is not None and self.storage_health.available

    @property
    def status(self) -> str:
        """What /health/status answers: ready or degraded (the balancer keeps the process),
        unavailable or draining (it takes the process out). Degraded is a ready process whose
        object store does not answer: every process shares that store, so taking them all out
        would turn cached blobs and everything that needs no store into the balancer's 503."""
        serving = self._serving_status()
        if serving == "ready" and not self.storage_health.available:
            return "degraded"
        return serving

    def _serving_status(self) -> str:
        if self.schema_too_new or self.storage is None:
            return "unavailable"
        if not self.payload_allowed():
            return "unavailable"
        if self.draining:
            return "draining"
        return "ready"

    @property
    def may_serve(self) -> bool:
        """True while this process may answer authorized requests (payload or metadata): the
        status is ready or draining. Asked several times per download, so not via `status`. A
        store that does not answer is no reason to refuse what needs no blob: reads of blobs
        answer 503 themselves (shared/download/object_transfer.py)."""
        return not self.schema_too_new and self.storage is not None and self.payload_allowed()

    def shared_downloads(self) -> dict[str, Any] | None:
        shared = self.settings.shared
        if shared is None:
            return None
        return {
            "slot": shared.slot,
            "slots": shared.slots,
            "active": self.lease is not None and self.lease.trusted,
            "leaseSeconds": round(self.lease.trust_remaining(), 3) if self.lease else 0.0,
            "generation": self.lease.generation if self.lease else None,
            "shareMode": shared.share_mode,
            # Demand mode: this process's share, its demand and what it waits for (null: static).
            "demand": self.demand.snapshot() if self.demand is not None else None,
        }

    # -- background work --------------------------------------------------------------------

    async def start_background(self, server_stop: asyncio.Event) -> asyncio.Task:
        """Start the supervised background loops; returns once every one has started (a failure
        to start is raised here), with the task that runs them until cancelled."""
        self._server_stop = server_stop
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def run_all() -> None:
            try:
                async with anyio.create_task_group() as tg:
                    for name, run in self._background_loops():
                        await tg.start(supervised, name, run, self._background_failed, (StartupError,))
                    started.set_result(None)
            except BaseException as exc:
                if not started.done():
                    started.set_exception(_single(exc))
                    return
                raise

        task = asyncio.create_task(run_all())
        await started
        return task

    def _background_loops(self) -> list[tuple[str, Any]]:
        assert self.control is not None
        pins = functools.partial(self.pins.run, self.settings.database_url, self._pins_unwritable)
        history = functools.partial(self.lease_history.run, lambda: self.pool)
        loops: list[tuple[str, Any]] = [
            ("read pins", pins), ("control connection", self.control.run), ("lease history", history),
        ]
        # Their error counts exist from the start, as 0 (arkvory_database_errors_total{loop}).
        DATABASE.expect(pins_loop.LOOP, control_loop.LOOP)
        if self.lease is not None:
            loops.append(("lease watcher", self._watch_lease))
            DATABASE.expect(lease_loop.LOOP)
            if self.demand is not None:
                loops.append(("demand shares", self.demand.run))
        if self.storage is not None and self.storage.kind != "file":
            loops.append(("storage probe", self.storage_health.run))
        return loops + self.extra_loops

    async def _watch_lease(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        assert self.lease is not None
        task_status.started()
        await self.lease.wait_lost()
        await self._stop_serving(f"lease lost: {self.lease.lost_reason}", EXIT_LEASE_LOST, "lease_lost")

    async def _background_failed(self, name: str, exc: BaseException) -> None:
        status = exc.exit_status if isinstance(exc, StartupError) else EXIT_LEASE_LOST
        await self._stop_serving(f"{name} stopped: {exc}", status, "process_failed")

    def _pins_unwritable(self) -> None:
        # payload_allowed() is already false; this cuts transfers waiting on a slow socket.
        self.transfers.abort_all("pins_unwritable")

    async def _stop_serving(self, reason: str, status: int, abort_reason: str) -> None:
        """Stop handing out payload at once, answer 503 for a short drain, then exit `status`."""
        if self.failure is not None:
            return  # the first reason wins; it already schedules the exit
        self.failure = reason
        if self.lease is not None:
            self.lease.abandon(reason)  # no-op when it is already lost
        self.bandwidth.close(LeaseLost(reason))
        self.transfers.abort_all(abort_reason)
        self.admission.drain()
        log.error("%s; answering 503 for %.0f s, then exiting %d", reason, LOST_DRAIN_S, status)
        await asyncio.sleep(LOST_DRAIN_S)
        self.exit_status = status
        if self._server_stop is not None:
            self._server_stop.set()

    async def drain(self, server_stop: asyncio.Event) -> None:
        """SIGTERM: refuse new transfers, finish those in flight (bounded), then stop."""
        if self.draining:
            return
        self.draining = True
        if self.control is not None:
            self.control.stopping()
        self.admission.drain()
        log.info("draining: waiting up to %d s for transfers in flight", self.settings.drain_timeout_s)
        idle = await self.admission.wait_idle(self.settings.drain_timeout_s)
        if not idle:
            log.warning("drain timeout: %d transfers still running are cut", self.admission.active)
        if self.lease is not None:
            # Keep the reservation: bytes already handed to the kernel may still be leaving.
            self.lease.stop_renewing()
        server_stop.set()

    # -- shutdown ---------------------------------------------------------------------------

    async def close(self) -> None:
        cache = getattr(self.storage, "cache", None)
        if cache is not None:
            cache.close()  # its fills stop; what they left in cache/filling/ goes at the next start
        if self.settings.shared is not None:
            # Usually just before this process exits for its lost lease: into its slot's row.
            await record_payload_after_trust(self.registry, self.settings.database_url, self.settings.shared.slot)
        # After a failure the database may be unreachable: never wait on it.
        lost = self.failure is not None or (self.lease is not None and self.lease.lost.is_set())
        if self.lease is not None:
            await self.lease.close()
        if self.pool is not None:
            if lost:
                self.pool.terminate()
            else:
                try:
                    await asyncio.wait_for(self.pool.close(), 5.0)
                except (TimeoutError, OSError, asyncpg.PostgresError):
                    self.pool.terminate()
        if self.control is not None:
            await self.control.close(wait=not lost)


def advertised_url(settings: Settings) -> str:
    """Where this process serves, as its lease row records it for the console's readiness
    look-ups: the listen address, or this host's name when it listens on every address."""
    scheme = "https" if settings.tls_cert_file is not None else "http"
    host = settings.host
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{settings.port}"


async def prepare_writer_state(control: asyncpg.Connection, settings: Settings) -> tuple[int, BlobStorage]:
    """What the writer does first, under the writer lock, and `arkvory admin init` without a
    server: migrate the schema, create the storage (or insist that it is this database's), and
    sweep what interrupted uploads left. Returns (schema version, storage)."""
    version = await db.migrate(control)
    storage = await open_storage(control, settings, who="the writer")
    await sweep_at_start(control, storage, settings.receive_timeout_s)
    return version, storage


def _single(exc: BaseException) -> BaseException:
    """The one exception inside a task group's group (the start-up error a caller expects)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
