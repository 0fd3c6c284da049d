"""Cleanup over 100,000 blobs (most referenced) while a download runs: wall time and the drop
of the download's rate.

Goal (issue 8): the cleanup task finishes in under a minute and does not lower the download
rate of a concurrent transfer by more than 10%.

A writer creates the schema and the storage directory; the blobs are then written straight into
the store (small unique files) and recorded with COPY, as uploads would leave them: --blobs in
all, of which --unreferenced-pct are unreferenced and older than the grace period, the rest each
referenced by one artifact; plus --strays old files with no row. One large artifact is uploaded
through the API for the downloads. Two gateways serve it: slot 1 unthrottled (share 2^40/3 B/s),
slot 2 throttled with ARKVORY_DOWNLOAD_BYTES_PER_SECOND.

For each gateway: curl downloads back to back (no cleanup) give the baseline rate; then the
store is refilled with garbage, writer/maintenance/cleanup.py `run(ctx)` runs in this process
(as the worker would run it, a real asyncpg pool, the same pacing) while curl downloads back to
back; the downloads that started and ended within the cleanup give the rate under cleanup.

    .venv/bin/python bench/cleanup.py [--blobs 100000] [--unreferenced-pct 10] [--strays 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import io
import os
import statistics
import subprocess
import threading
import time
import uuid

from cluster import (
    ADMIN_TOKEN,
    MAX_RATE,
    BenchCluster,
    BenchError,
    MiB,
    bench_main,
    blob_file,
    create_repo,
    need_tool,
    table,
    upload,
    verdict,
    warm_page_cache,
)

import asyncpg  # noqa: E402

from arkvory.shared.settings import Settings  # noqa: E402
from arkvory.shared.storage import Storage  # noqa: E402
from arkvory.writer.maintenance import cleanup  # noqa: E402
from arkvory.writer.worker.offline import OfflineContext  # noqa: E402

BLOB_BYTES = 512
GRACE_S = 3600


def write_files(storage: Storage, count: int, tag: bytes, old: bool) -> list[tuple[str, int]]:
    """`count` unique small files under their digests; with `old`, mtime two hours back."""
    import hashlib

    made = []
    base = os.urandom(BLOB_BYTES)
    back = time.time() - 2 * GRACE_S
    for index in range(count):
        data = tag + index.to_bytes(8, "big") + base[len(tag) + 8:]
        sha256 = hashlib.sha256(data).hexdigest()
        path = storage.blob_file(sha256)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, data)
        os.close(fd)
        if old:
            os.utime(path, (back, back))
        made.append((sha256, len(data)))
    return made


async def record(database_url: str, repo: str, referenced: list, unreferenced: list) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        repo_id = await conn.fetchval("SELECT id FROM arkvory_repositories WHERE name = $1", repo)
        old = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=2 * GRACE_S)
        await conn.copy_records_to_table(
            "arkvory_blobs", columns=("sha256", "size", "created_at"),
            records=[(d, s, old) for d, s in referenced + unreferenced],
        )
        await conn.copy_records_to_table(
            "arkvory_artifacts", columns=("id", "repository_id", "name", "sha256", "size", "media_type"),
            records=[(uuid.uuid4(), repo_id, f"b{i}", d, s, "application/octet-stream") for i, (d, s) in enumerate(referenced)],
        )
        await conn.execute("ANALYZE arkvory_blobs; ANALYZE arkvory_artifacts")
    finally:
        await conn.close()


def fill_garbage(bench: BenchCluster, storage: Storage, repo: str, args, round_tag: bytes, referenced: bool) -> int:
    """Write the round's blobs; returns how many are garbage (unreferenced rows + strays)."""
    total = args.blobs
    garbage = total * args.unreferenced_pct // 100
    kept = write_files(storage, total - garbage, round_tag + b"k", old=True) if referenced else []
    loose = write_files(storage, garbage, round_tag + b"u", old=True)
    write_files(storage, args.strays, round_tag + b"s", old=True)
    asyncio.run(record(bench.database_url, repo, kept, loose))
    os.sync()  # a store is not measured while the kernel still writes it out
    return garbage + args.strays


def curl_once(url: str, byte_range: str | None) -> tuple[float, float, int]:
    """(start, end, bytes) of one download to /dev/null."""
    argv = [need_tool("curl"), "-sS", "-o", "/dev/null", "-w", "%{http_code} %{size_download}",
            "-H", f"Authorization: Bearer {ADMIN_TOKEN}"]
    if byte_range:
        argv += ["-r", byte_range]
    argv.append(url)
    start = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    end = time.monotonic()
    code, got = out.stdout.split() if out.returncode == 0 else ("000", "0")
    if code not in ("200", "206"):
        raise BenchError(f"download failed: HTTP {code} {out.stderr.strip()}")
    return start, end, int(got)


def downloads_while(url: str, byte_range: str | None, stop: threading.Event) -> list[tuple[float, float, int]]:
    done = []
    while not stop.is_set():
        done.append(curl_once(url, byte_range))
    return done


def baseline(url: str, byte_range: str | None, runs: int) -> float:
    rates = []
    for _ in range(runs):
        start, end, got = curl_once(url, byte_range)
        rates.append(got / (end - start))
    return statistics.median(rates)


async def run_cleanup(bench: BenchCluster, settings: Settings) -> tuple[float, dict]:
    pool = await asyncpg.create_pool(bench.database_url, min_size=1, max_size=2)
    try:
        ctx = OfflineContext("cleanup", {"grace_seconds": GRACE_S}, pool, Storage(bench.data_dir), settings, out=io.StringIO())
        started = time.monotonic()
        result = await cleanup.run(ctx)
        return time.monotonic() - started, result
    finally:
        await pool.close()


def measure(bench, settings, url: str, byte_range: str | None, runs: int) -> tuple[float, float, float, dict, int]:
    """(baseline rate, rate under cleanup, cleanup seconds, result, downloads counted)."""
    base = baseline(url, byte_range, runs)
    stop = threading.Event()
    found: list = []
    loader = threading.Thread(target=lambda: found.extend(downloads_while(url, byte_range, stop)))
    loader.start()
    time.sleep(1.0)  # the download loop is running before cleanup starts
    t0 = time.monotonic()
    took, result = asyncio.run(run_cleanup(bench, settings))
    t1 = time.monotonic()
    stop.set()
    loader.join()
    inside = [(s, e, g) for s, e, g in found if s >= t0 and e <= t1]
    if not inside:  # the cleanup was shorter than one download: count those overlapping it
        inside = [(s, e, g) for s, e, g in found if e > t0 and s < t1]
    during = sum(g for _, _, g in inside) / sum(e - s for s, e, _ in inside)
    after = baseline(url, byte_range, runs)
    return statistics.mean([base, after]), during, took, result, len(inside)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blobs", type=int, default=100_000)
    parser.add_argument("--unreferenced-pct", type=int, default=10)
    parser.add_argument("--strays", type=int, default=1000)
    parser.add_argument("--download-mib", type=int, default=256)
    parser.add_argument("--throttle-mib", type=int, default=40, help="the throttled gateway's local limit")
    parser.add_argument("--runs", type=int, default=3, help="baseline downloads before and after")
    args = parser.parse_args()

    rows, goals = [], []
    with BenchCluster() as bench:
        shared = bench.shared(slots=3, total=MAX_RATE)
        writer = bench.writer(shared)
        create_repo(writer, "bench")
        big = upload(writer, "bench", "big.bin", args.download_mib * MiB)
        storage = Storage(bench.data_dir)
        settings = Settings.from_env(bench.cluster.base_env())
        fast = bench.gateway(1, shared)
        slow = bench.gateway(2, shared, ARKVORY_DOWNLOAD_BYTES_PER_SECOND=str(args.throttle_mib * MiB))
        warm_page_cache(blob_file(bench.data_dir, big["sha256"]))
        throttled_range = f"0-{args.throttle_mib * 2 * MiB - 1}"  # about 2 s per download
        for round_no, (label, gateway, byte_range) in enumerate((
            ("unthrottled (slot 1)", fast, None),
            (f"throttled {args.throttle_mib} MiB/s (slot 2)", slow, throttled_range),
        )):
            t0 = time.monotonic()
            garbage = fill_garbage(bench, storage, "bench", args, b"r%d" % round_no, referenced=round_no == 0)
            print(f"{label}: store filled in {time.monotonic() - t0:.1f} s "
                  f"({garbage} garbage of {args.blobs * (round_no == 0) + garbage} new files)", flush=True)
            base, during, took, result, counted = measure(bench, settings, gateway.url + big["path"], byte_range, args.runs)
            deleted = result["deleted_blobs"]
            if deleted != garbage:
                raise BenchError(f"{label}: cleanup deleted {deleted} blobs, expected {garbage}")
            drop = 1 - during / base
            rows.append((label, f"{took:.1f}", str(deleted), f"{base / MiB:.0f}", f"{during / MiB:.0f}",
                         f"{drop * 100:+.1f}%", str(counted)))
            goals.append((f"{label}: cleanup wall time", f"{took:.1f} s", "< 60 s", verdict(took < 60)))
            goals.append((f"{label}: download rate drop", f"{drop * 100:.1f}%", "≤ 10%", verdict(drop <= 0.10)))
        blobs_now = asyncio.run(_count(bench.database_url))
    print()
    print(table(rows, ("download", "cleanup s", "deleted", "MiB/s before", "MiB/s during", "drop", "downloads")))
    print()
    print(table(goals, ("figure", "value", "goal", "result")))
    print(f"\n(store: {args.blobs} blobs, {args.unreferenced_pct}% unreferenced and old, {args.strays} stray files "
          f"per round; {blobs_now} blob rows left; cleanup pace {cleanup.PACE}; client: curl -o /dev/null)")
    return 0


async def _count(database_url: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetchval("SELECT count(*) FROM arkvory_blobs")
    finally:
        await conn.close()


if __name__ == "__main__":
    bench_main("cleanup", 1200, main)
