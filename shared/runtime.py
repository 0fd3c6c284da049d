"""One running Arkvory process: start-up checks, the resources it owns, and its health state.

`Runtime.start` does everything that may refuse the start (settings are already valid): the
database, the writer lock or the gateway's maintenance lock, migrations or the schema check,
storage identity, the download policy and the slot lease. Only then does the server bind its
port, so a process that cannot serve never accepts a connection.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry

from . import db, policy
from .admission import Admission
from .catalog_cache import CatalogCache
from .errors import DatabaseUnavailable, LeaseLost, StartupRefused
from .identity import KeyRing
from .lease import SlotLease
from .metrics import Metrics
from .pins import ReadPins
from .settings import Settings
from .storage import Storage, prepare_storage, verify_storage
from .throttle import BandwidthScheduler
from .transfers import Transfers

log = logging.getLogger("arkvory.runtime")

EXIT_LEASE_LOST = 75  # EX_TEMPFAIL: the service manager restarts us, we wait for the slot
LOST_DRAIN_S = 2.0  # keep answering 503 `unavailable` this long before exiting


class Runtime:
    def __init__(self, settings: Settings, keys: KeyRing, registry: CollectorRegistry | None = None):
        self.settings = settings
        self.keys = keys
        self.registry = registry or CollectorRegistry()
        self.metrics = Metrics(self.registry)
        self.control: asyncpg.Connection | None = None
        self.pool: asyncpg.Pool | None = None
        self.storage: Storage | None = None
        self.lease: SlotLease | None = None
        self.schema_version: int | None = None
        self.schema_too_new = False
        self.draining = False
        self.exit_status = 0
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
        self.catalog = CatalogCache()
        self._publish_configured_shares()

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
        self.control = await db.connect(
            settings.database_url,
            server_settings={"application_name": f"arkvory-{settings.role}-control"},
        )
        if settings.is_writer:
            await self._start_writer()
        else:
            await self._start_gateway()
        if settings.shared is not None and not self.schema_too_new:
            self.lease = SlotLease(
                settings.database_url, settings.shared.slot, settings.role, report=self.metrics
            )
            await self.lease.acquire()
        self.pool = await db.create_pool(settings)
        await self.catalog.listen(self.control)

    async def _start_writer(self) -> None:
        assert self.control is not None
        got_lock = await self.control.fetchval("SELECT pg_try_advisory_lock($1)", db.WRITER_LOCK)
        if not got_lock:
            raise StartupRefused(
                "another Arkvory writer is already running against this database "
                "(only one writer per database)"
            )
        self.schema_version = await db.migrate(self.control)
        self.storage = await prepare_storage(
            self.control, self.settings.data_dir, stale_upload_s=self.settings.receive_timeout_s
        )
        await policy.save_or_check(self.control, self.settings.shared)

    async def _start_gateway(self) -> None:
        assert self.control is not None and self.settings.shared is not None
        version = await db.schema_version(self.control)
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
        shared_lock = await self.control.fetchval(
            "SELECT pg_try_advisory_lock_shared($1)", db.MAINTENANCE_LOCK
        )
        if not shared_lock:
            raise StartupRefused("an offline repair tool holds the maintenance lock; try later")
        self.storage = await verify_storage(self.control, self.settings.data_dir)
        await policy.check(self.control, self.settings.shared)

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

    # -- state read by every request --------------------------------------------------------

    @property
    def status(self) -> str:
        if self.schema_too_new or self.storage is None:
            return "unavailable"
        if self.lease is not None and not self.lease.trusted:
            return "unavailable"
        if self.draining:
            return "draining"
        return "ready"

    @property
    def may_serve(self) -> bool:
        """True while this process may answer authorized requests (payload or metadata)."""
        return self.status in ("ready", "draining")

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
        }

    # -- background work --------------------------------------------------------------------

    async def run_heartbeat(self, server_stop: "asyncio.Event") -> None:
        """Renew the lease and refresh read pins until the process stops or the lease is lost."""
        tasks = [asyncio.create_task(self.pins.run(self.settings.database_url))]
        if self.lease is not None:
            tasks.append(asyncio.create_task(self._watch_lease(server_stop)))
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    async def _watch_lease(self, server_stop: asyncio.Event) -> None:
        assert self.lease is not None
        await self.lease.run()
        if not self.lease.lost.is_set():
            return  # stopped renewing on purpose (graceful drain)
        self.bandwidth.close(LeaseLost(self.lease.lost_reason or "lease lost"))
        self.transfers.abort_all("lease_lost")
        self.admission.drain()
        log.error("lease lost; answering 503 for %.0f s, then exiting %d", LOST_DRAIN_S, EXIT_LEASE_LOST)
        await asyncio.sleep(LOST_DRAIN_S)
        self.exit_status = EXIT_LEASE_LOST
        server_stop.set()

    async def drain(self, server_stop: asyncio.Event) -> None:
        """SIGTERM: refuse new transfers, finish those in flight (bounded), then stop."""
        if self.draining:
            return
        self.draining = True
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
        lost = self.lease is not None and self.lease.lost.is_set()
        if self.lease is not None:
            await self.lease.close()
        if self.pool is not None:
            if lost:
                self.pool.terminate()  # the database may be unreachable: never wait on it
            else:
                try:
                    await asyncio.wait_for(self.pool.close(), 5.0)
                except (TimeoutError, OSError, asyncpg.PostgresError):
                    self.pool.terminate()
        if self.control is not None:
            if lost:
                self.control.terminate()
            else:
                try:
                    await asyncio.wait_for(self.control.close(), 2.0)
                except (TimeoutError, OSError, asyncpg.PostgresError):
                    self.control.terminate()
