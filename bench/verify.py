"""Unthrottled re-hash speed of the `verify` task vs `sha256sum` on the same blob files.

Goal (issue 8): verify re-hashes at ≥ 0.8 × sha256sum's speed on the same host when unthrottled.

A writer creates the schema and the storage directory; the blobs (1 GiB by default, in a few
sizes: a quarter in 128 MiB files, a quarter in 4 MiB files, a quarter in 256 KiB files and a
quarter in 32 KiB files) are then written straight into the store and recorded in
`arkvory_blobs`, as uploads would leave them. Both contenders read the same files from a warm
page cache (read once before measuring), alternating, --runs times each:

- `sha256sum FILE...` (GNU coreutils, one process per 1,000 files as xargs would; wall time);
- for reference only, `openssl dgst -sha256 FILE...` when openssl is installed (the same
  SHA-256 code hashlib uses: SHA-NI where the CPU has it, which coreutils' own code may not use);
- writer/maintenance/verify.py `run(ctx)` with `bytes_per_second: 0`, in this process, with a
  real asyncpg pool and the worker's TaskContext under a budget (its batches, per-blob budget
  checks and progress included, only the task-row writes left out; wall time of `run`).

    .venv/bin/python bench/verify.py [--size-mib 1024] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import statistics
import subprocess
import time
import uuid

from cluster import MiB, KiB, BenchCluster, BenchError, bench_main, need_tool, table, verdict

import asyncpg  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from arkvory.shared.settings import Settings  # noqa: E402
from arkvory.shared.storage import Storage  # noqa: E402
from arkvory.writer.maintenance import verify  # noqa: E402
from arkvory.writer.tasks.store import Fence  # noqa: E402
from arkvory.writer.worker.context import RunningTask  # noqa: E402
from arkvory.writer.worker.metrics import WorkerMetrics  # noqa: E402

# (share of the total, file size)
MIX = ((0.25, 128 * MiB), (0.25, 4 * MiB), (0.25, 256 * KiB), (0.25, 32 * KiB))


def make_blobs(storage: Storage, total: int) -> list[tuple[str, int]]:
    """Write incompressible files of the MIX sizes straight under their digests (no fsync: a
    benchmark store need not survive a crash); (sha256, size) of each."""
    made = []
    block = os.urandom(4 * MiB)
    index = 0
    for share, size in MIX:
        for _ in range(max(1, int(total * share) // size)):
            chunks = []
            written = 0
            while written < size:
                piece = (index.to_bytes(8, "big") + block[8:])[: size - written]
                index += 1
                chunks.append(piece)
                written += len(piece)
            data = b"".join(chunks)
            sha256 = hashlib.sha256(data).hexdigest()
            path = storage.blob_file(sha256)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
            made.append((sha256, size))
    return made


async def record_blobs(database_url: str, blobs: list[tuple[str, int]]) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.executemany("INSERT INTO arkvory_blobs (sha256, size) VALUES ($1, $2)", blobs)
    finally:
        await conn.close()


class BenchContext(RunningTask):
    """The worker's own TaskContext (per-blob progress counted and checked against a budget,
    events coalesced), minus the task rows: the writes it would make (at most two progress
    events a second, and one reservation per thread hop of a budgeted task) are left out."""

    def __init__(self, pool: asyncpg.Pool, storage: Storage, settings: Settings) -> None:
        task = {
            "id": uuid.uuid4(), "kind": "verify", "params": {"bytes_per_second": 0}, "on_restart": "fail",
            "checkpoint": None, "usage": None,
            # Limits that never trip, so every budget check runs as in a budgeted task.
            "budget": {"max_items": 2**62, "max_bytes": 2**62, "max_transitions": 2**62},
        }
        super().__init__(
            task, Fence(uuid.uuid4().hex, 0, 0), pool=pool, storage=storage, settings=settings,
            metrics=WorkerMetrics(CollectorRegistry()),
        )

    async def _write(self, event: str, data: dict, fields: dict, *, conn=None) -> None:
        pass

    async def _write_usage(self, usage: dict, event: dict | None = None, *, conn=None) -> None:
        pass


async def time_verify(database_url: str, storage: Storage, settings: Settings) -> tuple[float, dict]:
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        ctx = BenchContext(pool, storage, settings)
        started = time.perf_counter()
        result = await verify.run(ctx)
        return time.perf_counter() - started, result
    finally:
        await pool.close()


SHA256SUM_ARGS = 1000  # paths per sha256sum process, well under ARG_MAX


def time_tool(argv: list[str], paths: list[str]) -> float:
    """Wall time of `argv FILE...` over every path (a few processes, as xargs would run it)."""
    started = time.perf_counter()
    for i in range(0, len(paths), SHA256SUM_ARGS):
        out = subprocess.run([*argv, *paths[i : i + SHA256SUM_ARGS]], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if out.returncode != 0:
            raise BenchError(f"{argv[0]} failed: {out.stderr.decode(errors='replace').strip()}")
    return time.perf_counter() - started


def time_sha256sum(paths: list[str]) -> float:
    return time_tool([need_tool("sha256sum")], paths)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    with BenchCluster() as bench:
        bench.writer()  # the schema and the storage layout, as a real installation has them
        storage = Storage(bench.data_dir)
        t0 = time.monotonic()
        blobs = make_blobs(storage, args.size_mib * MiB)
        asyncio.run(record_blobs(bench.database_url, blobs))
        total = sum(size for _, size in blobs)
        print(f"wrote {len(blobs)} blobs, {total / MiB:.0f} MiB, in {time.monotonic() - t0:.1f} s", flush=True)
        paths = [storage.blob_file(sha256) for sha256, _ in blobs]
        settings = Settings.from_env(
            {"ARKVORY_DATABASE_URL": bench.database_url, "ARKVORY_DATA_DIR": str(bench.data_dir)}
        )
        # Warm-up: page cache, lazy imports, the pool's first connection.
        time_sha256sum(paths)
        asyncio.run(time_verify(bench.database_url, storage, settings))
        openssl = shutil.which("openssl")
        runs: dict[str, list[float]] = {"sha256sum": [], "verify (unthrottled)": []}
        if openssl:
            runs["openssl dgst -sha256 (reference)"] = []
        for _ in range(args.runs):
            runs["sha256sum"].append(total / time_sha256sum(paths))
            if openssl:
                runs["openssl dgst -sha256 (reference)"].append(total / time_tool([openssl, "dgst", "-sha256"], paths))
            seconds, result = asyncio.run(time_verify(bench.database_url, storage, settings))
            if result["checked"] != len(blobs) or result["missing"] or result["corrupt"]:
                raise BenchError(f"verify did not find the store intact: {result}")
            runs["verify (unthrottled)"].append(total / seconds)

    rows = []
    medians = {}
    for name, rates in runs.items():
        medians[name] = statistics.median(rates)
        rows.append((name, f"{medians[name] / MiB:.0f}", f"{max(rates) / MiB:.0f}", f"{min(rates) / MiB:.0f}"))
    print()
    print(table(rows, ("hasher", "MiB/s (median)", "MiB/s (best)", "MiB/s (worst)")))
    ratio = medians["verify (unthrottled)"] / medians["sha256sum"]
    print()
    figures = [("verify / sha256sum", f"{ratio:.2f}", "≥ 0.80", verdict(ratio >= 0.8))]
    reference = medians.get("openssl dgst -sha256 (reference)")
    if reference:
        figures.append(("verify / openssl (reference)", f"{medians['verify (unthrottled)'] / reference:.2f}", "-", "-"))
    print(table(figures, ("figure", "ratio", "goal", "result")))
    mix = ", ".join(f"{int(share * 100)}% in {size // KiB} KiB files" for share, size in MIX)
    print(f"\n({args.runs} alternating runs over {len(blobs)} blobs, {total / MiB:.0f} MiB ({mix}), page cache warm)")
    return 0


if __name__ == "__main__":
    bench_main("verify", 900, main)
