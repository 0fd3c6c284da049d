"""Operator tools that work on the database directly (SPEC §9)."""

from __future__ import annotations

import sys

from . import db
from .errors import StartupRefused


async def reset_download_policy(url: str) -> int:
    """Delete every lease and the policy in one transaction; refuse while a lease is live."""
    try:
        conn = await db.connect(url)
    except StartupRefused as exc:
        print(f"arkvory: {exc}", file=sys.stderr)
        return 1
    try:
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
    finally:
        await conn.close()
    print("download policy and leases deleted; start the writer with the new settings")
    return 0


async def show_status(url: str) -> int:
    try:
        conn = await db.connect(url)
    except StartupRefused as exc:
        print(f"arkvory: {exc}", file=sys.stderr)
        return 1
    try:
        version = await db.schema_version(conn)
        print(f"schema version: {version}")
        if not version:
            return 0
        policy = await conn.fetchrow("SELECT * FROM arkvory_download_policy")
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
    finally:
        await conn.close()
    return 0
