"""Health endpoints (SPEC §8): status for the balancer, readiness for operators, metrics.

The states (Runtime.status): `ready` and `degraded` answer 200, so a balancer keeps the process;
`unavailable` and `draining` answer 503 with Retry-After, so it takes the process out. Degraded:
the object store does not answer, and the process serves what needs none (its read cache, all
metadata) and answers the rest with its own 503 `unavailable` (docs/operations.md, "Readiness states").

Readiness also says where the process runs (`host`, `address`), which of its parts work now
(`parts`: database, lease, storage, read cache; `readCache` with its figures), and whether its
storage answers (`storage`: available or unavailable, with `storageLocation` and, while it does
not answer, `storageProblem`: one line naming the setting to look at, never a credential).

Readiness and metrics also say how many stored blobs the verify task found missing or corrupt
(`storageDiagnostics`, gauge `arkvory_storage_diagnostics{problem}`), on every process: an
operator who watches any one of them learns of it. The counts come from the database, so they
are cached per process for a few seconds, refreshed by one query at a time, and a request waits
for a refresh at most DIAGNOSTICS_WAIT_S: a slow or unreachable database makes them `null`,
never a failed or hanging readiness answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable

import asyncpg
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from arkvory.shared.auth.credentials import resolve
from arkvory.shared.errors import Unauthorized
from arkvory.shared.http.access_log import note_principal

from .runtime import IN_POOL, Runtime

log = logging.getLogger("arkvory.health")

RETRY_AFTER = {"Retry-After": "2"}
DIAGNOSTICS_FRESH_S = 5.0  # counts this old are answered from memory
DIAGNOSTICS_WAIT_S = 0.5  # a request waits this long for a refresh, then answers null
DIAGNOSTICS_QUERY_TIMEOUT_S = 5.0  # the refresh itself, in the background
PROBLEMS = ("missing", "corrupt")


class DiagnosticCounts:
    """This process's cached view of `arkvory_storage_diagnostics`, and its gauge."""

    def __init__(self, registry: CollectorRegistry, clock: Callable[[], float] = time.monotonic) -> None:
        try:
            self.gauge: Gauge | None = Gauge(
                "arkvory_storage_diagnostics",
                "Stored blobs the verify task found wrong, by problem (missing, corrupt)",
                ["problem"],
                registry=registry,
            )
            # Both series from the first scrape (issue 24 item 2), 0 until the database answers
            # (the refresh waits DIAGNOSTICS_WAIT_S at most).
            for problem in PROBLEMS:
                self.gauge.labels(problem=problem)
        except ValueError:  # the registry has it already (the worker's own metrics): theirs it is
            self.gauge = None
        self._clock = clock
        self._counts: dict[str, int] | None = None
        self._read_at: float | None = None
        self._refresh: asyncio.Task | None = None
        self._failing = False

    async def current(self, pool: asyncpg.Pool | None) -> dict[str, int] | None:
        """`{"missing": n, "corrupt": n}`, or None when the database did not answer in time."""
        if self._read_at is not None and self._clock() - self._read_at < DIAGNOSTICS_FRESH_S:
            return self._counts
        if pool is None:
            return None
        if self._refresh is None:
            # One refresh at a time, kept running past a request that stopped waiting for it.
            self._refresh = asyncio.get_running_loop().create_task(self._read(pool))
        done, _ = await asyncio.wait({self._refresh}, timeout=DIAGNOSTICS_WAIT_S)
        return self._counts if done else None

    async def _read(self, pool: asyncpg.Pool) -> None:
        try:
            async with pool.acquire(timeout=DIAGNOSTICS_QUERY_TIMEOUT_S) as conn:
                rows = await conn.fetch(
                    "SELECT problem, count(*) AS n FROM arkvory_storage_diagnostics GROUP BY problem",
                    timeout=DIAGNOSTICS_QUERY_TIMEOUT_S,
                )
            counts = dict.fromkeys(PROBLEMS, 0)
            counts.update({row["problem"]: row["n"] for row in rows if row["problem"] in counts})
            self._counts = counts
            if self.gauge is not None:
                for problem, n in counts.items():
                    self.gauge.labels(problem=problem).set(n)
            self._failing = False
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            self._counts = None
            if not self._failing:  # once per outage, not once per probe
                log.warning("cannot count storage diagnostics: %s: %s", exc.__class__.__name__, exc)
            self._failing = True
        finally:
            self._read_at = self._clock()
            self._refresh = None


_diagnostics: weakref.WeakKeyDictionary[Runtime, DiagnosticCounts] = weakref.WeakKeyDictionary()


def _diagnostics_of(runtime: Runtime) -> DiagnosticCounts:
    # Made on first use: the health routes are the only readers, and the runtime's registry
    # is all the gauge needs.
    counts = _diagnostics.get(runtime)
    if counts is None:
        counts = _diagnostics[runtime] = DiagnosticCounts(runtime.registry)
    return counts


def _runtime(request: Request) -> Runtime:
    return request.app.state.runtime


async def _require_key(request: Request) -> None:
    # Any credential kind will do (keys file, managed key, token, session): health is not secret
    # from a known principal, only from the anonymous internet.
    runtime = _runtime(request)
    principal = await resolve(runtime.keys, runtime.credentials, runtime.pool, request.headers.get("authorization"))
    note_principal(request.scope, principal.id)
    if principal.is_anonymous:
        raise Unauthorized("this endpoint needs a key")


async def status(request: Request) -> Response:
    state = _runtime(request).status
    if state in IN_POOL:
        return JSONResponse({"status": state})
    return JSONResponse({"status": state}, status_code=503, headers=RETRY_AFTER)


async def live(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> Response:
    await _require_key(request)
    runtime = _runtime(request)
    bandwidth = runtime.bandwidth
    state = runtime.status
    body = {
        "status": state,
        "role": runtime.settings.role,
        # Uploads need the store: a degraded writer takes other changes, not uploads.
        "writable": runtime.settings.is_writer and state == "ready",
        "sharedDownloads": runtime.shared_downloads(),
        "transfers": {
            "downloads": {
                "admission": runtime.admission.snapshot(),
                "bandwidth": {
                    "bytesPerSecond": bandwidth.bytes_per_second,
                    "perPrincipalBytesPerSecond": bandwidth.per_principal_bytes_per_second,
                    "burstBytes": bandwidth.burst_bytes,
                    "grantedBytes": bandwidth.granted_bytes,
                },
            }
        },
        "schemaVersion": runtime.schema_version,
        # Where this process runs and where its blobs are: with an object store, processes may
        # run on several hosts (SPEC §11).
        "host": runtime.hostname,
        "address": runtime.address,
        "storage": "available" if runtime.storage_available else "unavailable",
        "storageLocation": runtime.storage.location if runtime.storage is not None else None,
        "storageProblem": runtime.storage_health.reason,
        "storageDiagnostics": await _diagnostics_of(runtime).current(getattr(runtime, "pool", None)),
        # Whether a failover would keep every renewal (shared/cluster/replication.py).
        "database": runtime.replication.current.as_json(),
        "parts": parts(runtime),
        "readCache": read_cache_figures(runtime),
    }
    if state not in IN_POOL:
        return JSONResponse(body, status_code=503, headers=RETRY_AFTER)
    return JSONResponse(body)


def parts(runtime: Runtime) -> dict[str, str]:
    """Which parts of the process work now, each in a word: what an operator reads first when
    the status is not `ready`."""
    lease = runtime.lease
    if lease is None:
        lease_state = "standalone" if runtime.settings.shared is None else "none"
    elif lease.lost.is_set():
        lease_state = "lost"
    else:
        lease_state = "trusted" if lease.trusted else "untrusted"
    return {
        # Read pins are written every few seconds: late, the database does not take our writes.
        "database": "available" if runtime.pins.healthy else "unavailable",
        "lease": lease_state,
        "storage": "available" if runtime.storage_available else "unavailable",
        "readCache": "off" if getattr(runtime.storage, "cache", None) is None else "available",
    }


def read_cache_figures(runtime: Runtime) -> dict[str, int] | None:
    """The read cache's files, bytes held and limit; None without one."""
    cache = getattr(runtime.storage, "cache", None)
    if cache is None:
        return None
    return {"files": cache.files, "bytes": cache.held, "maxBytes": cache.max_bytes}


async def metrics(request: Request) -> Response:
    runtime = _runtime(request)
    if not runtime.settings.public_metrics:
        await _require_key(request)
    await _diagnostics_of(runtime).current(getattr(runtime, "pool", None))  # the gauge, fresh enough
    return Response(generate_latest(runtime.registry), media_type=CONTENT_TYPE_LATEST)


routes = [
    Route("/health/status", status, methods=["GET", "HEAD"]),
    Route("/health/live", live, methods=["GET", "HEAD"]),
    Route("/health/ready", ready, methods=["GET", "HEAD"]),
    Route("/health/metrics", metrics, methods=["GET", "HEAD"]),
]
