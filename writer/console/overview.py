"""The overview: every slot's lease, the saved policy, each process's readiness (its trust left
and budget use), the worker, storage diagnostics. For administrators only: anyone else who
opens the console lands on the repositories instead.

The database knows the leases (holder, generation, times, and the reservation left by its own
clock) and the URL each process recorded at acquisition (shared/cluster/lease.py). What only a
process knows (the trust it has left, its admission queue and granted bytes) is in its
readiness: the console asks every process's `/health/ready` in parallel, from the server, with
the signed-in session as the bearer (readiness needs any credential, SPEC §8) and a short
timeout; a process that does not answer in time is shown as unreachable. The writer's own
readiness is read in-process. `/console/overview.json` is the same data for the page's script,
which refreshes the live cells every two seconds.

The worker: `arkvory_worker_lock_held`'s query (writer/tasks/metrics.py) says whether a worker
is active and which backend holds the lock; every worker keeps its lock connection open under
the application name `arkvory-worker <host> pid <pid>` (writer/worker/lock.py), active or
standing by, so `pg_stat_activity` lists them all.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.errors import Forbidden

from ..tasks.metrics import installation_state
from .internal import Refused
from .session import NOTICES, ConsoleUser, api_for, page, render, runtime_of, see_other
from .views import when

if TYPE_CHECKING:
    import httpx

READY_TIMEOUT_S = 1.5
REPOSITORIES = "/console/repositories"
DIAGNOSTICS_SHOWN = 20

_LEASES = """
SELECT slot, holder_id, generation, pid, host, role, url, acquired_at, renewed_at, expires_at,
       extract(epoch FROM expires_at - now())::float8 AS reservation_left
FROM arkvory_gateway_leases ORDER BY slot
"""
_POLICY = (
    "SELECT slots, total_bytes_per_second, per_principal_bytes_per_second, saved_at, share_mode"
    " FROM arkvory_download_policy"
)
_WORKERS = """
SELECT pid, application_name, backend_start, client_addr::text AS client_addr
FROM pg_stat_activity
WHERE datname = current_database() AND application_name LIKE 'arkvory-worker %'
ORDER BY backend_start
"""


def _tls_context(request: Request) -> ssl.SSLContext:
    """The system's authorities, and this writer's own certificate: processes of one host
    usually serve the same one, often self-signed."""
    state = request.app.state
    context = getattr(state, "readiness_tls", None)
    if context is None:
        context = ssl.create_default_context()
        cert = runtime_of(request).settings.tls_cert_file
        if cert is not None:
            try:
                context.load_verify_locations(cafile=str(cert))
            except (OSError, ssl.SSLError):
                pass  # not usable as an authority: the system's still are
        state.readiness_tls = context
    return context


def _readiness_of(body: Any, status: int) -> dict[str, Any]:
    if status not in (200, 503) or not isinstance(body, dict) or not isinstance(body.get("status"), str):
        return {"reachable": False, "problem": f"answered {status}, not a readiness document"}
    return {"reachable": True, **body}


async def _remote_readiness(client: httpx.AsyncClient, url: str, token: str) -> dict[str, Any]:
    import httpx  # noqa: PLC0415  (the server loads the HTTP client only when an overview asks)

    try:
        answer = await client.get(url.rstrip("/") + "/health/ready", headers={"Authorization": f"Bearer {token}"})
        body = answer.json()
    except httpx.HTTPError as exc:
        return {"reachable": False, "problem": f"unreachable ({exc.__class__.__name__})"}
    except ValueError:
        return {"reachable": False, "problem": "unreachable (the answer is not JSON)"}
    return _readiness_of(body, answer.status_code)


async def _own_readiness(request: Request, user: ConsoleUser) -> dict[str, Any]:
    answer = await api_for(request, user).call("GET", "/health/ready")
    try:
        return _readiness_of(answer.json(), answer.status)
    except ValueError:
        return {"reachable": False, "problem": f"answered {answer.status}"}


def _is_own(runtime: Any, lease: dict[str, Any]) -> bool:
    own = runtime.lease
    return own is not None and lease["slot"] == own.slot and lease["holder_id"] == own.holder_id


async def overview_data(request: Request, user: ConsoleUser, *, details: bool = True) -> dict[str, Any]:
    runtime = runtime_of(request)
    assert runtime.pool is not None
    async with pooled(runtime.pool) as conn:
        leases = [dict(row) for row in await conn.fetch(_LEASES, timeout=POOLED_QUERY_TIMEOUT_S)]
        policy = await conn.fetchrow(_POLICY, timeout=POOLED_QUERY_TIMEOUT_S)
        installation = await installation_state(conn)
        worker_sessions = [dict(row) for row in await conn.fetch(_WORKERS, timeout=POOLED_QUERY_TIMEOUT_S)]

    async def readiness(lease: dict[str, Any] | None, client: httpx.AsyncClient) -> dict[str, Any]:
        if lease is None or _is_own(runtime, lease):
            return await _own_readiness(request, user)
        url = lease["url"]
        if not url or not url.startswith(("http://", "https://")):
            return {"reachable": False, "problem": "no URL recorded (a process older than the console)"}
        return await _remote_readiness(client, url, user.token)

    import httpx  # noqa: PLC0415  (as above)

    rows: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=READY_TIMEOUT_S, verify=_tls_context(request), trust_env=False) as client:
        targets: list[dict[str, Any] | None] = list(leases) if leases else [None]
        answers = await asyncio.gather(*(readiness(lease, client) for lease in targets))
    for lease, ready in zip(targets, answers):
        row = {"lease": lease, "ready": ready, "own": lease is None or _is_own(runtime, lease)}
        if lease is not None:
            row["expired"] = lease["reservation_left"] <= 0
        rows.append(row)

    own_ready = next((row["ready"] for row in rows if row["own"]), None)
    diagnostics_counts = own_ready.get("storageDiagnostics") if own_ready and own_ready.get("reachable") else None
    diagnostics: dict[str, Any] | None = None
    diagnostics_error: str | None = None
    if details and user.admin:
        try:
            diagnostics = await api_for(request, user).fetch(
                "/api/v1/storage/diagnostics", {"limit": str(DIAGNOSTICS_SHOWN)}
            )
        except Refused as refusal:
            diagnostics_error = refusal.message
    holder = installation["worker_lock_pid"]
    workers = [
        {**session, "active": session["pid"] == holder} for session in worker_sessions
    ]
    return {
        "processes": rows,
        "standalone": not leases,
        "policy": dict(policy) if policy else None,
        "share": (policy["total_bytes_per_second"] // policy["slots"]) if policy else None,
        "worker_active": bool(installation["worker_lock_held"]),
        "workers": workers,
        "leases_live": installation["leases_live"],
        "diagnostics_counts": diagnostics_counts,
        "diagnostics": diagnostics,
        "diagnostics_error": diagnostics_error,
    }


@page
async def overview_page(request: Request, user: ConsoleUser) -> Response:
    if not user.admin:
        # Processes, hosts, PIDs and readiness URLs are the operator's: an account lands on
        # what it may use, with the notice it was sent here with (e.g. its password changed).
        notice = request.query_params.get("notice")
        return see_other(REPOSITORIES, notice if notice in NOTICES else None)
    data = await overview_data(request, user)
    return render(request, user, "overview.html", data)


def _live_row(row: dict[str, Any]) -> dict[str, Any]:
    lease, ready = row["lease"], row["ready"]
    shared = ready.get("sharedDownloads") if ready.get("reachable") else None
    downloads = (ready.get("transfers") or {}).get("downloads") or {} if ready.get("reachable") else {}
    admission = downloads.get("admission") or {}
    bandwidth = downloads.get("bandwidth") or {}
    return {
        "key": "standalone" if lease is None else f"slot-{lease['slot']}",
        "status": ready.get("status") if ready.get("reachable") else ready.get("problem"),
        "reachable": bool(ready.get("reachable")),
        "trustLeft": shared.get("leaseSeconds") if isinstance(shared, dict) else None,
        "reservationLeft": None if lease is None else round(max(0.0, lease["reservation_left"]), 1),
        "renewedAt": None if lease is None else when(lease["renewed_at"]),
        "generation": None if lease is None else lease["generation"],
        "grantedBytes": bandwidth.get("grantedBytes"),
        "bytesPerSecond": bandwidth.get("bytesPerSecond"),
        # demand shares (issue 23): the share moves, and with it the demand it answers
        "shareMode": shared.get("shareMode") if isinstance(shared, dict) else None,
        "demandBytesPerSecond": ((shared or {}).get("demand") or {}).get("demandBytesPerSecond")
        if isinstance(shared, dict) else None,
        "active": admission.get("active"),
        "waiting": admission.get("waiting"),
    }


@page
async def overview_json(request: Request, user: ConsoleUser) -> Response:
    if not user.admin:
        raise Forbidden("the overview is for administrators")
    data = await overview_data(request, user, details=False)
    return JSONResponse({
        "processes": [_live_row(row) for row in data["processes"]],
        "workerActive": data["worker_active"],
        "workers": len(data["workers"]),
    })
