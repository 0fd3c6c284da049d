"""What the audit trail costs a change (issue 25 item 11): a small change's transaction (a
repository INSERT, as POST /api/v1/repositories makes it) with and without its audit entry
(writer/audit/trail.py `record`), in alternating batches on one real PostgreSQL, so that a
shared machine's load falls on both alike; the median batch of each is reported.

    .venv/bin/python bench/audit_cost.py [--batches 6] [--changes 300]
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import tempfile
import time
import uuid

import asyncpg

from arkvory.shared import db
from arkvory.shared.cli.localpg import start_local_postgres
from arkvory.writer.audit.trail import Actor, Entry, Origin, record

ACTOR = Actor("key", "key:admin", "admin")


async def batch(conn: asyncpg.Connection, audited: bool, changes: int) -> float:
    """Seconds per change over `changes` transactions."""
    started = time.perf_counter()
    for _ in range(changes):
        async with conn.transaction():
            name = uuid.uuid4().hex
            await conn.execute("INSERT INTO arkvory_repositories (id, name, public) VALUES ($1, $2, false)",
                               uuid.uuid4(), name)
            if audited:
                entry = Entry("repository.create", 201, repository=name, target=name, details={"name": name, "public": False})
                await record(conn, ACTOR, entry, Origin("127.0.0.1", "bench-1"))
    return (time.perf_counter() - started) / changes


async def measure(url: str, batches: int, changes: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        await db.migrate(conn)
        plain, audited = [], []
        for _ in range(batches):
            plain.append(await batch(conn, False, changes))
            audited.append(await batch(conn, True, changes))
    finally:
        await conn.close()
    p, a = sorted(plain)[batches // 2], sorted(audited)[batches // 2]
    print(f"per change: without the entry {p * 1e3:.3f} ms, with it {a * 1e3:.3f} ms,"
          f" {a / p:.2f}x, {(a - p) * 1e3:.3f} ms more")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--changes", type=int, default=300)
    args = parser.parse_args()
    server = start_local_postgres(pathlib.Path(tempfile.mkdtemp()), fsync=False)
    try:
        asyncio.run(measure(server.create_database("audit_cost"), args.batches, args.changes))
    finally:
        server.destroy()


if __name__ == "__main__":
    main()
