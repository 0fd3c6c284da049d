"""`arkvory get -q -o FILE` (the command a user runs) vs `curl -o FILE` of the same URL (issue 14 §3).

Goal: the CLI ≥ 0.8 × curl, median of alternating runs, for 512 MiB and 1 GiB, from a standalone
writer (no shared rate: what `arkvory dev` or a single-host install serves). The CLI's whole run
counts: interpreter start, imports, the request, the SHA-256 check and the rename into place.
Alongside, for information: the library's `Client.download` in this process (no start-up), and
the durable pair `arkvory get --fsync` vs `curl -o FILE && sync FILE`.

Each run writes a new file in the bench's directory after a `sync` (no earlier run's dirty pages
are written back in its time); the blob is in the page cache; the variants alternate, each round
starting with the next one, so none always follows the same other. The CLI runs once before the
measured runs (as a user's installed copy, it then has its modules' bytecode).

    .venv/bin/python bench/cli_get.py [--sizes-mib 512 1024] [--runs 5] [--durable]
        [--reference-cli OTHER/.venv/bin/arkvory] [--without-sha-extensions]

`--reference-cli` adds another tree's `arkvory` to the alternation (before/after in one run).
`--without-sha-extensions` runs every `arkvory get` with OpenSSL's SHA extensions (SHA-NI) masked
(`OPENSSL_ia32cap`), as on a CPU without them, where hashlib's SHA-256 runs ~3× slower: the
CLI's SHA-256 check is then the slowest stage of its pipeline (the library row, in this
process, keeps them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from cluster import (
    ADMIN_TOKEN,
    ROOT,
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

from arkvory.shared.client import Client, RetryPolicy

GOAL = 0.8


def curl_get(url: str, out: str, size: int, durable: bool) -> float:
    argv = [
        need_tool("curl"), "-sS", "-o", out, "-w", "%{http_code} %{size_download}",
        "-H", f"Authorization: Bearer {ADMIN_TOKEN}", url,
    ]
    started = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if durable:
        subprocess.run([need_tool("sync"), out], check=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise BenchError(f"curl failed ({result.returncode}): {result.stderr.strip()}")
    code, got = result.stdout.split()
    if code != "200" or int(got) != size:
        raise BenchError(f"curl: HTTP {code}, {got} of {size} bytes")
    return seconds


# OpenSSL's capability mask with the SHA extensions bit (word 2, bit 29) cleared.
WITHOUT_SHA_EXTENSIONS = {"OPENSSL_ia32cap": ":~0x20000000"}
CLI_ENV: dict[str, str] = {}


def cli_get(base_url: str, artifact: dict, out: str, durable: bool, cli: str | None = None) -> float:
    argv = [cli or str(ROOT / ".venv" / "bin" / "arkvory"), "get", "bench", artifact["id"], "-q", "-o", out]
    if durable:
        argv.append("--fsync")
    env = {**os.environ, "ARKVORY_URL": base_url, "ARKVORY_TOKEN": ADMIN_TOKEN, **CLI_ENV}
    # A user's installed package has its bytecode (pip compiles a wheel's modules); a sandbox
    # that sets PYTHONDONTWRITEBYTECODE would make every run compile ~30 modules (~20 ms).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    started = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise BenchError(f"arkvory get failed ({result.returncode}): {result.stderr.strip()}")
    if os.path.getsize(out) != artifact["size"]:
        raise BenchError(f"arkvory get: {os.path.getsize(out)} of {artifact['size']} bytes")
    return seconds


def library_get(base_url: str, artifact: dict, out: str) -> float:
    started = time.perf_counter()
    with Client(base_url, ADMIN_TOKEN, retry=RetryPolicy(max_attempts=2)) as client:
        result = client.download("bench", out, artifact_id=artifact["id"])
    seconds = time.perf_counter() - started
    if result.sha256 != artifact["sha256"] or result.attempts != 1:
        raise BenchError(f"client download: {result}")
    return seconds


def alternate(variants: dict[str, Callable[[], float]], out: str, runs: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants.items())
    for run in range(runs):
        shift = run % len(order)
        for name, measure in order[shift:] + order[:shift]:
            if os.path.exists(out):
                os.unlink(out)
            subprocess.run([need_tool("sync")], check=True)
            times[name].append(measure())
    if os.path.exists(out):
        os.unlink(out)
    return times


def each(times: list[float]) -> str:
    return " ".join(f"{t:.2f}" for t in times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--durable", action="store_true", help="also get --fsync vs curl + sync")
    parser.add_argument("--no-library", action="store_true", help="skip the in-process Client.download row")
    parser.add_argument("--reference-cli", help="another tree's `arkvory` command, run alternately with this one")
    parser.add_argument(
        "--without-sha-extensions", action="store_true", help="run the CLI with OpenSSL's SHA extensions masked"
    )
    args = parser.parse_args()
    if args.without_sha_extensions:
        CLI_ENV.update(WITHOUT_SHA_EXTENSIONS)
    rows: list[tuple] = []
    with BenchCluster() as bench:
        writer = bench.writer()  # standalone: no shared rate
        create_repo(writer, "bench")
        out = str(bench.workdir / "downloaded.bin")
        for size_mib in args.sizes_mib:
            size = size_mib * MiB
            artifact = upload(writer, "bench", f"big-{size_mib}.bin", size)
            warm_page_cache(blob_file(bench.data_dir, artifact["sha256"]))
            url = writer.url + artifact["path"]
            cli_get(writer.url, artifact, out, False)  # warm-up: bytecode written, caches filled
            os.unlink(out)
            if args.reference_cli:
                cli_get(writer.url, artifact, out, False, args.reference_cli)
                os.unlink(out)
            variants: dict[str, Callable[[], float]] = {
                "curl -o FILE": lambda: curl_get(url, out, size, False),
                "arkvory get -q -o FILE": lambda: cli_get(writer.url, artifact, out, False),
            }
            if args.reference_cli:
                variants["reference arkvory get -q -o FILE"] = lambda: cli_get(
                    writer.url, artifact, out, False, args.reference_cli
                )
            if not args.no_library:
                variants["Client.download (in process)"] = lambda: library_get(writer.url, artifact, out)
            if args.durable:
                variants["curl -o FILE && sync FILE"] = lambda: curl_get(url, out, size, True)
                variants["arkvory get -q --fsync -o FILE"] = lambda: cli_get(writer.url, artifact, out, True)
            times = alternate(variants, out, args.runs)
            curl = statistics.median(times["curl -o FILE"])
            synced = statistics.median(times.get("curl -o FILE && sync FILE", [0.0]))
            for name, measured in times.items():
                median = statistics.median(measured)
                baseline = synced if "sync" in name or "fsync" in name else curl
                ratio = baseline / median
                goal = ""
                if name in ("arkvory get -q -o FILE", "reference arkvory get -q -o FILE"):
                    goal = f"{ratio:.2f} (≥ {GOAL:.2f})"
                elif "curl" not in name:
                    goal = f"{ratio:.2f} (information)"
                rows.append((
                    f"{size_mib} MiB: {name}", f"{median:.2f}", f"{min(measured):.2f}–{max(measured):.2f}",
                    each(measured), f"{size / MiB / median:.0f}", goal,
                    verdict(ratio >= GOAL) if name == "arkvory get -q -o FILE" else "",
                ))
    print()
    print(table(rows, ("what", "s (median)", "range", "each run", "MiB/s", "× curl (goal)", "result")))
    masked = ", CLI without SHA extensions" if args.without_sha_extensions else ""
    load = os.getloadavg()
    print(f"\n({args.runs} alternating runs per size, standalone writer{masked}; load average {load[0]:.2f}; {machine()})")
    return 0


if __name__ == "__main__":
    sys.exit(bench_main("cli_get", 1800, main))
