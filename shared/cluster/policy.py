"""The saved download policy (SPEC §4): the writer saves it, every process must match it."""

from __future__ import annotations

import asyncpg

from arkvory.shared.errors import StartupRefused
from arkvory.shared.settings import SharedDownloads

_REQUIRED = "the database requires the shared download configuration"


def _describe(slots: int, total: int, per_principal: int, share_mode: str) -> str:
    return (
        f"ARKVORY_GATEWAY_SLOTS={slots}, ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND={total}, "
        f"ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL={per_principal}, "
        f"ARKVORY_SHARE_MODE={share_mode}"
    )


async def _saved(conn: asyncpg.Connection) -> asyncpg.Record | None:
    return await conn.fetchrow(
        "SELECT slots, total_bytes_per_second, per_principal_bytes_per_second, share_mode"
        " FROM arkvory_download_policy",
        timeout=10,
    )


def _mismatch(saved: asyncpg.Record, shared: SharedDownloads) -> str | None:
    wanted = shared.policy
    if tuple(saved) == wanted:
        return None
    return (
        f"{_REQUIRED} saved as {_describe(*saved)}, but this process has {_describe(*wanted)}; "
        "rates, slots and the share mode cannot change on a running installation (see docs/operations.md: Changing the download policy)"
    )


async def save_or_check(conn: asyncpg.Connection, shared: SharedDownloads | None) -> None:
    """Writer: save the policy on first shared start; refuse when it differs or is missing."""
    async with conn.transaction():
        await conn.execute("LOCK TABLE arkvory_download_policy IN EXCLUSIVE MODE", timeout=10)
        saved = await _saved(conn)
        if saved is None:
            if shared is not None:
                await conn.execute(
                    "INSERT INTO arkvory_download_policy"
                    " (slots, total_bytes_per_second, per_principal_bytes_per_second, share_mode)"
                    " VALUES ($1, $2, $3, $4)",
                    *shared.policy,
                )
            return
        if shared is None:
            raise StartupRefused(
                f"{_REQUIRED} ({_describe(*saved)}); start the writer with these variables "
                "and ARKVORY_GATEWAY_SLOT=0, or reset the policy (arkvory admin reset-download-policy)"
            )
        problem = _mismatch(saved, shared)
        if problem:
            raise StartupRefused(problem)


async def check(conn: asyncpg.Connection, shared: SharedDownloads) -> None:
    """Gateway: start only after the writer saved a policy equal to our own numbers."""
    saved = await _saved(conn)
    if saved is None:
        raise StartupRefused(
            "no download policy is saved in the database: start the writer with the "
            "shared-download configuration first, then the gateways"
        )
    problem = _mismatch(saved, shared)
    if problem:
        raise StartupRefused(problem)
