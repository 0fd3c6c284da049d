"""Single-stream throughput of a 1 GiB artifact: a gateway vs nginx on the same blob file.

Goal (issue): gateway ≥ 0.8 × nginx throughput, and server CPU seconds per GiB ≤ 2 × nginx.

The gateway runs in shared mode with the largest total the settings accept (2^40 B/s), so its
share (total // slots) never limits it: this is as unthrottled as a gateway can be. The client
is curl writing to /dev/null; the blob is in the page cache (read once before measuring).
Server CPU = utime + stime from /proc/<pid>/stat before/after each download (nginx: master and
workers). Each server gets --runs downloads, alternating; the table shows the median run.

    .venv/bin/python bench/throughput.py [--size-mib 1024] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

from cluster import (
    ADMIN_TOKEN,
    MAX_RATE,
    BenchCluster,
    BenchError,
    GiB,
    MiB,
    Nginx,
    bench_main,
    blob_file,
    cpu_seconds,
    create_repo,
    need_tool,
    table,
    tree_cpu_seconds,
    upload,
    verdict,
    warm_page_cache,
)


def curl_download(url: str, headers: dict[str, str], size: int, timeout: float) -> tuple[float, int]:
    """(seconds, bytes) of one download with curl to /dev/null."""
    argv = [need_tool("curl"), "-sS", "-o", "/dev/null", "-w", "%{http_code} %{size_download} %{time_total}"]
    for name, value in headers.items():
        argv += ["-H", f"{name}: {value}"]
    argv.append(url)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise BenchError(f"curl {url} failed ({out.returncode}): {out.stderr.strip()}")
    code, got, seconds = out.stdout.split()
    if code != "200" or int(got) != size:
        raise BenchError(f"curl {url}: HTTP {code}, {got} of {size} bytes")
    return float(seconds), int(got)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    size = args.size_mib * MiB

    with BenchCluster() as bench:
        shared = bench.shared(slots=2, total=MAX_RATE)
        writer = bench.writer(shared)
        create_repo(writer, "bench")
        t0 = time.monotonic()
        artifact = upload(writer, "bench", "big.bin", size)
        print(f"uploaded {size // MiB} MiB in {time.monotonic() - t0:.1f} s", flush=True)
        gateway = bench.gateway(1, shared)
        blob = blob_file(bench.data_dir, artifact["sha256"])
        warm_page_cache(blob)
        nginx = Nginx(bench.data_dir, bench.workdir)
        try:
            targets = {
                "gateway (share 2^40/2 B/s)": (
                    gateway.url + artifact["path"],
                    {"Authorization": f"Bearer {ADMIN_TOKEN}"},
                    lambda: cpu_seconds(gateway.proc.pid),
                ),
                "nginx (sendfile on, 1 worker)": (
                    nginx.url + "/" + str(blob.relative_to(bench.data_dir)),
                    {},
                    lambda: tree_cpu_seconds(nginx.pids()),
                ),
            }
            # one warm-up download each (connection paths, page cache, lazy imports)
            for url, headers, _ in targets.values():
                curl_download(url, headers, size, timeout=300)
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name in targets}
            for _ in range(args.runs):
                for name, (url, headers, cpu) in targets.items():
                    before = cpu()
                    seconds, got = curl_download(url, headers, size, timeout=300)
                    used = cpu() - before
                    runs[name].append((got / seconds, used / (got / GiB)))
        finally:
            nginx.close()

    rows = []
    medians = {}
    for name, results in runs.items():
        rate = statistics.median(r for r, _ in results)
        cpu = statistics.median(c for _, c in results)
        best = max(r for r, _ in results)
        medians[name] = (rate, cpu)
        rows.append((name, f"{rate / MiB:.0f}", f"{best / MiB:.0f}", f"{cpu:.3f}"))
    print()
    print(table(rows, ("server", "MiB/s (median)", "MiB/s (best)", "server CPU s/GiB")))
    (g_rate, g_cpu), (n_rate, n_cpu) = medians.values()
    rate_ratio = g_rate / n_rate
    cpu_ratio = g_cpu / n_cpu if n_cpu > 0 else float("inf")
    print()
    print(
        table(
            [
                ("throughput gateway / nginx", f"{rate_ratio:.2f}", "≥ 0.80", verdict(rate_ratio >= 0.8)),
                ("CPU per GiB gateway / nginx", f"{cpu_ratio:.2f}", "≤ 2.00", verdict(cpu_ratio <= 2.0)),
            ],
            ("figure", "ratio", "goal", "result"),
        )
    )
    print(f"\n({args.runs} runs of {size // MiB} MiB each, after one warm-up; client: curl -o /dev/null)")
    return 0


if __name__ == "__main__":
    bench_main("throughput", 900, main)
