"""Operator tools that work on the database directly (SPEC §9).

Each tool is `async def tool(conn) -> exit status`; `run_tool` connects and reports a database
that cannot be reached the same way for all of them.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable

import asyncpg

from . import db
from .errors import StartupError

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


async def show_status(conn: asyncpg.Connection) -> int:
    version = await db.schema_version(conn)
    print(f"schema version: {version}")
    if not version:
        return 0
    policy = await conn.fetchrow(
        "SELECT slots, total_bytes_per_second, per_principal_bytes_per_second, saved_at"
        " FROM arkvory_download_policy"
    )
    print(f"download policy: {dict(policy) if policy else 'none (standalone)'}")
    for row in await conn.fetch(
        "SELECT slot, generation, pid, host, role, expires_at > now() AS live,"
        " round(extract(epoch FROM expires_at - now())::numeric, 1) AS remaining"
        " FROM arkvory_gateway_leases ORDER BY slot"
    ):
        print(
            f"slot {row['slot']}: {row['role']} pid {row['pid']} on {row['host']}, "
            f"generation {row['generation']}, "
            + (f"live for {row['remaining']} s" if row["live"] else "expired")
        )
    return 0
