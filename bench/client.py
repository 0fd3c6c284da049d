"""The client library's transfers of 1 GiB vs the raw tools on the same host (issue 9).

Goals: `Client.download` ≥ 0.8 × `curl -o` of the same URL from an unthrottled gateway, the
client's SHA-256 check and rename included in its time. Like curl, the client leaves writing
back to the kernel by default; every run also measures `Client.download(durable=True)` (what
`arkvory get --fsync` does: early flushes, fsync, rename, directory fsync) next to curl followed
by `sync FILE`, the same durability: the disk's write speed bounds both, so that row is for
information. `Client.upload` ≥ 0.8 × the raw resumable upload of bench/upload.py (same part
size, one part at a time, part hashes computed before its clock starts), the client's
hashing of each part included in its time.

The gateway runs in shared mode with the largest total the settings accept (2^40 B/s), as in
bench/throughput.py. Downloads write to a file in the bench's directory (curl with `-o FILE`),
runs alternate (curl, client, durable client; each round starting with the next one), each
after a `sync` so that no earlier run's dirty pages are written back in its time; the blob is
in the page cache; the table shows medians and every run's time. Uploads alternate too; each
client upload uses a new artifact name (a re-upload of the same name and bytes would be
recognised as done and send nothing).

    .venv/bin/python bench/client.py [download|upload|both] [--size-mib 1024] [--runs 3] [--part-mib 16]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import time

from cluster import (
    ADMIN_TOKEN,
    MAX_RATE,
    BenchCluster,
    BenchError,
    MiB,
    bench_main,
    blob_file,
    create_repo,
    machine,
    need_tool,
    table,
    upload,
    verdict,
    warm_page_cache,
)
from upload import make_file, part_hashes, resumable_upload

from arkvory.shared.client import Client, RetryPolicy


def curl_to_file(url: str, out: str, size: int, synced: list[float]) -> float:
    """Seconds of `curl -o out`; appends to `synced` the seconds with `sync out` after it."""
    argv = [
        need_tool("curl"), "-sS", "-o", out, "-w", "%{http_code} %{size_download}",
        "-H", f"Authorization: Bearer {ADMIN_TOKEN}", url,
    ]
    started = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise BenchError(f"curl failed ({result.returncode}): {result.stderr.strip()}")
    code, got = result.stdout.split()
    if code != "200" or int(got) != size:
        raise BenchError(f"curl: HTTP {code}, {got} of {size} bytes")
    subprocess.run([need_tool("sync"), out], check=True)
    synced.append(time.perf_counter() - started)
    return seconds


def client_download(base_url: str, repo: str, artifact: dict, out: str, durable: bool) -> float:
    started = time.perf_counter()
    with Client(base_url, ADMIN_TOKEN, retry=RetryPolicy(max_attempts=2)) as client:
        result = client.download(repo, out, artifact_id=artifact["id"], durable=durable)
    seconds = time.perf_counter() - started
    if result.sha256 != artifact["sha256"] or result.attempts != 1:
        raise BenchError(f"client download: {result}")
    return seconds


def bench_download(bench: BenchCluster, size: int, runs: int) -> list[tuple]:
    shared = bench.shared(slots=2, total=MAX_RATE)
    writer = bench.writer(shared)
    gateway = bench.gateway(1, shared)
    create_repo(writer, "bench")
    artifact = upload(writer, "bench", "big.bin", size)
    warm_page_cache(blob_file(bench.data_dir, artifact["sha256"]))
    url = gateway.url + artifact["path"]
    out = str(bench.workdir / "downloaded.bin")
    curl_times, curl_synced, client_times, durable_times = [], [], [], []
    variants = [
        (lambda: curl_to_file(url, out, size, curl_synced), curl_times),
        (lambda: client_download(gateway.url, "bench", artifact, out, False), client_times),
        (lambda: client_download(gateway.url, "bench", artifact, out, True), durable_times),
    ]
    for run in range(runs):
        # Each round starts with another variant: none always runs right after the same one.
        for measure, into in variants[run % 3:] + variants[: run % 3]:
            if os.path.exists(out):
                os.unlink(out)
            subprocess.run([need_tool("sync")], check=True)  # earlier runs' dirty pages are not ours
            into.append(measure())
    os.unlink(out)
    curl_rate = size / MiB / statistics.median(curl_times)
    synced_rate = size / MiB / statistics.median(curl_synced)
    client_rate = size / MiB / statistics.median(client_times)
    durable_rate = size / MiB / statistics.median(durable_times)
    ratio = client_rate / curl_rate
    return [
        ("download: curl -o FILE", f"{statistics.median(curl_times):.2f}", each(curl_times), f"{curl_rate:.0f}", "", ""),
        ("download: Client.download (SHA-256, rename) vs curl", f"{statistics.median(client_times):.2f}",
         each(client_times), f"{client_rate:.0f}", f"{ratio:.2f} (≥ 0.80)", verdict(ratio >= 0.8)),
        ("download: curl -o FILE && sync FILE", f"{statistics.median(curl_synced):.2f}", each(curl_synced),
         f"{synced_rate:.0f}", "", ""),
        ("download: Client.download durable=True (get --fsync) vs curl + sync",
         f"{statistics.median(durable_times):.2f}", each(durable_times), f"{durable_rate:.0f}",
         f"{durable_rate / synced_rate:.2f} (information)", ""),
    ]


def each(times: list[float]) -> str:
    """Every run's seconds, in order: on a shared host the spread says how far to trust a median."""
    return " ".join(f"{t:.2f}" for t in times)


def bench_upload(bench: BenchCluster, size: int, runs: int, part: int) -> list[tuple]:
    writer = bench.writer(ARKVORY_MIN_FREE_BYTES="0")
    create_repo(writer, "bench")
    source = bench.workdir / "source.bin"
    make_file(source, size)
    hashes = part_hashes(source, size, part)
    digest = hashlib.sha256()
    with open(source, "rb") as file:
        while chunk := file.read(8 * MiB):
            digest.update(chunk)
    whole = digest.hexdigest()
    raw_times, client_times = [], []
    for run in range(runs):
        raw_times.append(resumable_upload(writer, source, size, part, hashes, whole))
        started = time.perf_counter()
        with Client(writer.url, ADMIN_TOKEN) as client:
            artifact = client.upload("bench", source, name=f"client-{run}.bin", part_size=part)
        client_times.append(time.perf_counter() - started)
        if artifact["sha256"] != whole:
            raise BenchError(f"client upload: {artifact}")
    raw_rate = size / MiB / statistics.median(raw_times)
    client_rate = size / MiB / statistics.median(client_times)
    ratio = client_rate / raw_rate
    return [
        (f"upload: raw resumable, {part // MiB} MiB parts, one at a time (bench/upload.py)",
         f"{statistics.median(raw_times):.2f}", each(raw_times), f"{raw_rate:.0f}", "", ""),
        ("upload: Client.upload (each part hashed as it is sent)", f"{statistics.median(client_times):.2f}",
         each(client_times), f"{client_rate:.0f}", f"{ratio:.2f} (≥ 0.80)", verdict(ratio >= 0.8)),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", choices=["download", "upload", "both"], default="both")
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--part-mib", type=int, default=16, choices=range(1, 65), metavar="1..64")
    args = parser.parse_args()
    size = args.size_mib * MiB
    rows: list[tuple] = []
    if args.what in ("download", "both"):
        with BenchCluster() as bench:
            rows += bench_download(bench, size, args.runs)
    if args.what in ("upload", "both"):
        with BenchCluster() as bench:
            rows += bench_upload(bench, size, args.runs, args.part_mib * MiB)
    print()
    print(table(rows, ("what", "seconds (median)", "each run", "MiB/s", "ratio (goal)", "result")))
    print(f"\n({args.runs} alternating runs of {args.size_mib} MiB each; {machine()})")
    return 0


if __name__ == "__main__":
    bench_main("client", 1800, main)
