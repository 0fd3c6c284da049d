"""Operator tools that work on the database directly (SPEC §9).

Each tool is `async def tool(conn) -> exit status`; `run_tool` connects and reports a database
that cannot be reached the same way for all of them. `status` prints for people (a table) or,
with `--json`, for machines: the same report either way. `initialize` (`arkvory admin init`)
runs the writer's own start-up steps (Runtime's `prepare_writer_state`) without a server.
"""

from __future__ import annotations

import datetime
import json
import re
import sys
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from arkvory.shared import db
from arkvory.shared.cluster import policy
from arkvory.shared.cluster.control import ControlConnection
from arkvory.shared.cluster.replication import read_replication
from arkvory.shared.errors import StartupError, StartupRefused, StorageUnreachable
from arkvory.shared.process.runtime import prepare_writer_state
from arkvory.shared.settings import Settings
from arkvory.shared.storage import ID_FILE, BlobStorage, StorageError, StorageRefused, open_storage
from arkvory.writer.audit.trail import Entry, record_tool_change

Tool = Callable[[asyncpg.Connection], Awaitable[int]]


async def run_tool(url: str, tool: Tool) -> int:
    try:
        conn = await db.connect(url)
    except StartupError as exc:
        print(f"arkvory: {exc}", file=sys.stderr)
        return exc.exit_status
    try:
        return await tool(conn)
    finally:
        await conn.close()


async def initialize(settings: Settings) -> int:
    """`arkvory admin init`: what the writer does at its first start, without serving: migrate
    the schema, create the storage layout and its id (or refuse storage that is not this
    database's), and save the download policy when the shared variables are set. Safe to
    repeat: each line says what was done or found. Raises StartupError (its exit status)."""
    control = ControlConnection(settings.database_url, "admin-init")
    conn = await control.open()
    try:
        try:
            await control.take_lock("writer")
        except StartupRefused:
            return await _check_beside_a_running_writer(conn, settings)
        before = await db.schema_version(conn) or 0
        had_storage = before > 0 and await conn.fetchval(
            "SELECT count(*) FROM arkvory_storage", timeout=db.QUERY_TIMEOUT_S
        )
        version, storage = await prepare_writer_state(conn, settings)
        storage_id = await _storage_id(storage)
        if before == version:
            print(f"schema           version {version}, up to date")
        else:
            print(f"schema           migrated from version {before} to {version}")
        if had_storage:
            print(f"storage          {_place(storage)}: storage id {storage_id}, this database's")
        else:
            print(f"storage          created {_place(storage)} (storage id {storage_id},"
                  f" in {_id_holder(storage)} and the database)")
        saved = await _saved_policy(conn)
        if settings.shared is not None:  # without the variables, a saved policy is left alone
            await policy.save_or_check(conn, settings.shared)
        print(f"download policy  {_policy_outcome(saved, settings)}")
        policy_saved = saved is None and settings.shared is not None
        if before != version or not had_storage or policy_saved:  # only when it changed something
            await record_tool_change(conn, "arkvory admin init", Entry("installation.init", details={
                "schemaFrom": before, "schemaTo": version, "storageCreated": not had_storage,
                "policySaved": policy_saved}))
    finally:
        await control.close()
    print("ready: start the writer, then the gateways and the worker")
    return 0


async def _check_beside_a_running_writer(conn: asyncpg.Connection, settings: Settings) -> int:
    """A writer holds the writer lock: it made the schema and storage at its start. Only check
    that this command's settings point at the same storage."""
    version = await db.schema_version(conn) or 0
    # Refuses another database's directory or bucket, as a gateway would.
    storage = await open_storage(conn, settings, who="arkvory admin init")
    print("a writer is running against this database: it created the schema and the storage at its start")
    print(f"schema           version {version}" + ("" if version == db.CODE_SCHEMA_VERSION else
          f" (this code knows {db.CODE_SCHEMA_VERSION})"))
    print(f"storage          {_place(storage)}: storage id {await _storage_id(storage)}, this database's")
    print(f"download policy  {_describe_policy(await _saved_policy(conn))}")
    return 0


def _place(storage: BlobStorage) -> str:
    """Where the blobs are: the directory, or the bucket and prefix."""
    return str(storage.root) if storage.kind == "file" else storage.location


def _id_holder(storage: BlobStorage) -> str:
    return ID_FILE if storage.kind == "file" else f"its {ID_FILE} object"


async def _storage_id(storage: BlobStorage) -> str | None:
    """The id the storage records (just checked against the database's by opening it)."""
    try:
        return await storage.read_storage_id()
    except StorageRefused as exc:  # changed since it was opened: the exits of start-up
        raise StartupRefused(exc.message) from None
    except StorageError as exc:
        raise StorageUnreachable(exc.message) from None


async def _saved_policy(conn: asyncpg.Connection) -> asyncpg.Record | None:
    return await conn.fetchrow(
        "SELECT slots, total_bytes_per_second, per_principal_bytes_per_second, share_mode FROM arkvory_download_policy",
        timeout=db.QUERY_TIMEOUT_S,
    )


def _describe_policy(saved: tuple[int, int, int, str] | asyncpg.Record | None) -> str:
    """`saved`: (slots, total, per-principal total, share mode), or None."""
    if saved is None:
        return "none (a standalone writer; gateways need ARKVORY_GATEWAY_SLOTS and the rates)"
    slots, total, per_principal, share_mode = tuple(saved)
    return f"{slots} slots, total {_rate(total)}, per principal {_rate(per_principal)}, {share_mode} shares"


def _policy_outcome(saved: asyncpg.Record | None, settings: Settings) -> str:
    if settings.shared is None:
        return _describe_policy(saved) + ("" if saved is None else " (saved before; kept)")
    if saved is None:
        shared = settings.shared
        return "saved: " + _describe_policy(shared.policy)
    return _describe_policy(saved) + " (saved before; the same numbers)"


async def reset_download_policy(conn: asyncpg.Connection) -> int:
    """Delete every lease and the policy in one transaction; refuse while a lease is live."""
    async with conn.transaction():
        await conn.execute(
            "LOCK TABLE arkvory_gateway_leases, arkvory_download_policy IN EXCLUSIVE MODE"
        )
        live = await conn.fetch(
            "SELECT slot, pid, host FROM arkvory_gateway_leases WHERE expires_at > now()"
        )
        if live:
            slots = ", ".join(f"slot {r['slot']} (pid {r['pid']} on {r['host']})" for r in live)
            print(
                f"arkvory: refusing: leases are still live: {slots}; stop every process "
                "and wait for the leases to expire",
                file=sys.stderr,
            )
            return 1
        saved = await _saved_policy(conn)
        leases = await conn.execute("DELETE FROM arkvory_gateway_leases")
        await conn.execute("DELETE FROM arkvory_download_policy")
        await record_tool_change(conn, "arkvory admin reset-download-policy", Entry("policy.reset", details={
            "policy": _describe_policy(saved), "leasesDeleted": int(leases.split()[-1])}))
    print("download policy and leases deleted; start the writer with the new settings")
    return 0


async def create_user(conn: asyncpg.Connection, *, name: str, hashed: Any, admin: bool) -> int:
    """Add an account (`hashed`: a writer.passwords.PasswordHash, made before connecting), as the
    API does: a name taken in any case is refused."""
    from arkvory.shared.errors import Conflict
    from arkvory.writer.identity.accounts import insert_account

    version = await db.schema_version(conn)
    if not version or version < 4:
        print("arkvory: the database has no accounts yet: start the writer once first", file=sys.stderr)
        return 1
    try:
        async with conn.transaction():
            await insert_account(conn, name, hashed, admin)
            await record_tool_change(conn, "arkvory admin create-user", Entry(
                "account.create", target=name, details={"name": name, "admin": admin}))
    except Conflict as exc:
        print(f"arkvory: {exc.message}", file=sys.stderr)
        return 1
    print(f"account {name!r} created{' (administrator)' if admin else ''}")
    return 0


def _utc(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _rate(bytes_per_second: int) -> str:
    if not bytes_per_second:
        return "unlimited"
    return f"{bytes_per_second:,} bytes/s ({bytes_per_second / 2**20:,.1f} MiB/s)"


def _span(seconds: float) -> str:
    seconds = abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.1f} s"


# The workers' lock connections, by the name each gives itself (writer/worker/lock.py
# `application_name`); the one holding the worker lock *in this database* is active.
_WORKERS = """
SELECT a.application_name, host(a.client_addr) AS address, a.backend_start,
       EXISTS (
           SELECT 1 FROM pg_locks l
           WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
             AND l.classid = ($1::bigint >> 32)::oid AND l.objid = ($1::bigint & 4294967295)::oid
       ) AS active
FROM pg_stat_activity a
WHERE a.datname = current_database() AND a.application_name LIKE 'arkvory-worker %'
ORDER BY active DESC, a.backend_start
"""
_WORKER_NAME = re.compile(r"^arkvory-worker (?P<host>.+) pid (?P<pid>\d+)$")


async def _workers(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    workers = []
    for row in await conn.fetch(_WORKERS, db.WORKER_LOCK, timeout=db.QUERY_TIMEOUT_S):
        named = _WORKER_NAME.match(row["application_name"])
        workers.append({
            "state": "active" if row["active"] else "standby",
            "host": named["host"] if named else row["application_name"].removeprefix("arkvory-worker "),
            "pid": int(named["pid"]) if named else None,
            "address": row["address"],  # None over a Unix socket
            "connectedAt": _utc(row["backend_start"]),
        })
    return workers


async def status_report(conn: asyncpg.Connection) -> dict[str, Any]:
    """Schema, storage, policy and leases as plain JSON values; lease times by the database
    clock. Each lease says where its holder runs: its machine (`host`) and the address it
    listens on (`address`), which tell processes on several hosts apart. `database`: whether
    the primary has a synchronous standby (shared/cluster/replication.py)."""
    version = await db.schema_version(conn)
    report: dict[str, Any] = {
        "schemaVersion": version or 0, "database": (await read_replication(conn)).as_json(),
        "storage": None, "downloadPolicy": None, "leases": [], "workers": [],
    }
    if not version:
        return report
    storage = await conn.fetchrow(
        "SELECT storage_id::text AS id, coalesce(to_jsonb(s) ->> 'location', 'file:') AS location"
        " FROM arkvory_storage s"
    )
    if storage:
        report["storage"] = {"id": storage["id"], "location": storage["location"]}
    policy = await conn.fetchrow(
        "SELECT slots, total_bytes_per_second, per_principal_bytes_per_second, saved_at,"
        " share_mode FROM arkvory_download_policy"
    )
    if policy:
        report["downloadPolicy"] = {
            "slots": policy["slots"],
            "totalBytesPerSecond": policy["total_bytes_per_second"],
            "perPrincipalBytesPerSecond": policy["per_principal_bytes_per_second"],
            "savedAt": _utc(policy["saved_at"]),
            "shareMode": policy["share_mode"],
        }
    for row in await conn.fetch(
        "SELECT slot, role, pid, host, url, generation, acquired_at,"
        " renewed_at, extract(epoch FROM expires_at - now())::float8 AS remaining,"
        # demand mode: the share the database granted this holder and the demand it reported
        " CASE WHEN share_generation = generation THEN share_granted END AS share,"
        " CASE WHEN share_generation = generation THEN share_demand END AS demand"
        " FROM arkvory_gateway_leases l ORDER BY slot"
    ):
        report["leases"].append({
            "slot": row["slot"],
            "role": row["role"],
            "pid": row["pid"],
            "host": row["host"],
            # host:port of the URL it serves on (migration 0010_lease_urls), as `address` in its
            # readiness: the processes of one host stay apart.
            "url": row["url"],
            "address": urllib.parse.urlsplit(row["url"]).netloc if row["url"] else None,
            "generation": row["generation"],
            "live": row["remaining"] > 0,
            "expiresInSeconds": round(row["remaining"], 1),
            "acquiredAt": _utc(row["acquired_at"]),
            "renewedAt": _utc(row["renewed_at"]),
            "shareBytesPerSecond": row["share"],
            "demandBytesPerSecond": row["demand"],
        })
    report["workers"] = await _workers(conn)
    return report


def _where(lease: dict[str, Any]) -> str:
    return f"{lease['host']}/{lease['address']}" if lease.get("address") else lease["host"]


def status_table(report: dict[str, Any]) -> str:
    lines = [f"schema version   {report['schemaVersion'] or 'none (no writer has started yet)'}"]
    lines.append(f"database         {_replication(report['database'])}")
    storage = report.get("storage")
    if storage is not None:
        lines.append(f"storage          {storage['location']} (storage id {storage['id']})")
    policy = report["downloadPolicy"]
    if policy is None:
        lines.append("download policy  none (standalone writer)")
    else:
        lines += [
            f"download policy  {policy['slots']} slots, saved {policy['savedAt']}",
            f"  total          {_rate(policy['totalBytesPerSecond'])}",
            f"  per principal  {_rate(policy['perPrincipalBytesPerSecond'])}",
            "  shares         " + (
                "demand (they follow the downloads, granted at every renewal)"
                if policy.get("shareMode") == "demand" else "static (the total divided equally by the slots)"
            ),
        ]
    workers = report["workers"]
    if not workers:
        lines.append("worker           none running (tasks wait in the queue: start arkvory worker)")
    else:
        active = [w for w in workers if w["state"] == "active"]
        lines.append(
            f"worker           {'active' if active else 'none active'}"
            + (f", {len(workers) - len(active)} standing by" if len(workers) > len(active) else "")
        )
    leases = report["leases"]
    if not leases:
        lines.append("leases           none")
    else:
        lines.append("")
        lines += _table(
            ("slot", "role", "pid", "host", "generation", "lease"),
            [
                (
                    # The machine, then where it listens: processes on one host stay apart.
                    str(lease["slot"]), lease["role"], str(lease["pid"]), _where(lease), str(lease["generation"]),
                    f"expires in {_span(lease['expiresInSeconds'])}" if lease["live"]
                    else f"expired {_span(lease['expiresInSeconds'])} ago",
                )
                for lease in leases
            ],
        )
        if policy is not None and policy.get("shareMode") == "demand":
            lines += [
                f"  slot {lease['slot']} share  {_rate(lease['shareBytesPerSecond'])}, demand "
                f"{_rate(lease['demandBytesPerSecond']) if lease['demandBytesPerSecond'] else 'none (idle)'}"
                for lease in leases
                if lease["live"] and lease["shareBytesPerSecond"] is not None
            ]
    if workers:
        lines.append("")
        lines += _table(
            ("worker", "pid", "host", "address", "connected"),
            [
                (w["state"], str(w["pid"] or "?"), w["host"], w["address"] or "local socket", w["connectedAt"])
                for w in workers
            ],
        )
    return "\n".join(lines)


def _replication(database: dict[str, Any]) -> str:
    """The `database` line: the primary's standbys, and whether a failover keeps every renewal."""
    standbys, synchronous = database["standbys"], database["synchronousStandbys"]
    text = {
        "none": "no standby streams from it (nothing to fail over to)",
        "synchronous": f"{synchronous} synchronous standby(s) of {standbys}: a failover keeps every renewal",
        "asynchronous": f"{standbys} standby(s), none synchronous: a failover may grant a slot twice",
        "unknown": f"{standbys} standby(s), synchronous or not unknown",
    }[database["replication"]]
    return f"{text} ({database['problem']})" if database["problem"] else text


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in (header, *rows)]


async def show_status(conn: asyncpg.Connection, *, as_json: bool = False) -> int:
    report = await status_report(conn)
    print(json.dumps(report, indent=2) if as_json else status_table(report))
    return 0
