"""Operator tools that work on the database directly (SPEC §9).

Each tool is `async def tool(conn) -> exit status`; `run_tool` connects and reports a database
that cannot be reached the same way for all of them. `status` prints for people (a table) or,
with `--json`, for machines: the same report either way.
"""

from __future__ import annotations

import datetime
import json
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from arkvory.shared import db
from arkvory.shared.errors import StartupError

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
        await conn.execute("DELETE FROM arkvory_gateway_leases")
        await conn.execute("DELETE FROM arkvory_download_policy")
    print("download policy and leases deleted; start the writer with the new settings")
    return 0


async def create_user(conn: asyncpg.Connection, *, name: str, hashed: Any, admin: bool) -> int:
    """Add an account (`hashed`: a writer.passwords.PasswordHash, made before connecting)."""
    version = await db.schema_version(conn)
    if not version or version < 4:
        print("arkvory: the database has no accounts yet: start the writer once first", file=sys.stderr)
        return 1
    try:
        await conn.execute(
            "INSERT INTO arkvory_accounts (id, name, password_hash, password_salt, scrypt_n, scrypt_r,"
            " scrypt_p, is_admin) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            uuid.uuid4(), name, hashed.digest, hashed.salt, hashed.n, hashed.r, hashed.p, admin,
        )
    except asyncpg.UniqueViolationError:
        print(f"arkvory: account {name!r} already exists", file=sys.stderr)
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


async def status_report(conn: asyncpg.Connection) -> dict[str, Any]:
    """Schema, storage, policy and leases as plain JSON values; lease times by the database
    clock. Each lease says where its holder runs: its machine (`host`) and the address it
    listens on (`address`), which tell processes on several hosts apart."""
    version = await db.schema_version(conn)
    report: dict[str, Any] = {"schemaVersion": version or 0, "storage": None, "downloadPolicy": None, "leases": []}
    if not version:
        return report
    storage = await conn.fetchrow(
        "SELECT storage_id::text AS id, coalesce(to_jsonb(s) ->> 'location', 'file:') AS location"
        " FROM arkvory_storage s"
    )
    if storage:
        report["storage"] = {"id": storage["id"], "location": storage["location"]}
    policy = await conn.fetchrow(
        "SELECT slots, total_bytes_per_second, per_principal_bytes_per_second, saved_at"
        " FROM arkvory_download_policy"
    )
    if policy:
        report["downloadPolicy"] = {
            "slots": policy["slots"],
            "totalBytesPerSecond": policy["total_bytes_per_second"],
            "perPrincipalBytesPerSecond": policy["per_principal_bytes_per_second"],
            "savedAt": _utc(policy["saved_at"]),
        }
    for row in await conn.fetch(
        "SELECT slot, role, pid, host, to_jsonb(l) ->> 'address' AS address, generation, acquired_at,"
        " renewed_at, extract(epoch FROM expires_at - now())::float8 AS remaining"
        " FROM arkvory_gateway_leases l ORDER BY slot"
    ):
        report["leases"].append({
            "slot": row["slot"],
            "role": row["role"],
            "pid": row["pid"],
            "host": row["host"],
            "address": row["address"],
            "generation": row["generation"],
            "live": row["remaining"] > 0,
            "expiresInSeconds": round(row["remaining"], 1),
            "acquiredAt": _utc(row["acquired_at"]),
            "renewedAt": _utc(row["renewed_at"]),
        })
    return report


def _where(lease: dict[str, Any]) -> str:
    return f"{lease['host']}/{lease['address']}" if lease.get("address") else lease["host"]


def status_table(report: dict[str, Any]) -> str:
    lines = [f"schema version   {report['schemaVersion'] or 'none (no writer has started yet)'}"]
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
        ]
    leases = report["leases"]
    if not leases:
        lines.append("leases           none")
        return "\n".join(lines)
    header = ("slot", "role", "pid", "host", "generation", "lease")
    rows = [
        (
            # The machine, then where it listens: processes on one host stay apart.
            str(lease["slot"]), lease["role"], str(lease["pid"]), _where(lease), str(lease["generation"]),
            f"expires in {_span(lease['expiresInSeconds'])}" if lease["live"]
            else f"expired {_span(lease['expiresInSeconds'])} ago",
        )
        for lease in leases
    ]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines.append("")
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in (header, *rows)]
    return "\n".join(lines)


async def show_status(conn: asyncpg.Connection, *, as_json: bool = False) -> int:
    report = await status_report(conn)
    print(json.dumps(report, indent=2) if as_json else status_table(report))
    return 0
