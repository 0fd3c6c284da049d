"""Slot leases under load: 60 s of saturating downloads plus a saturated database pool.

Goal (issue): zero lost leases and zero failed renewals
(`arkvory_leases_lost_total`, `arkvory_lease_renewals_total{result!="ok"}` from /health/metrics).

Writer (slot 0) and one gateway (slot 1), shared mode with the largest total (2^40 B/s, so the
downloads run as fast as the CPUs allow), ARKVORY_DATABASE_POOL_SIZE=--pool-size on both. Load,
all at once for --seconds:
  * downloads: --curls curl loops per process fetching a 256 MiB artifact over and over;
  * pool: wrk -c64 against the writer's artifact metadata route (one pooled query each) and
    wrk -c64 against the gateway's content route with `Range: bytes=0-0` (two pooled queries,
    admission, a read pin and a 1-byte transfer each).
Both CPUs are saturated (the table shows the CPU used by each server). Every 0.5 s the script
reads /health/ready of both processes and records the lease trust left (`leaseSeconds`) and
how long the answer took (a proxy for event-loop lag).

    .venv/bin/python bench/lease_under_load.py [--seconds 60] [--pool-size 2] [--curls 2]
"""

from __future__ import annotations

import argparse
import subprocess
import threading
import time

import httpx

from cluster import (
    ADMIN_TOKEN,
    MAX_RATE,
    BenchCluster,
    MiB,
    bench_main,
    cpu_seconds,
    create_repo,
    fmt_bytes,
    metrics,
    need_tool,
    run_wrk,
    table,
    upload,
    verdict,
)


def curl_loop(url: str, deadline: float, results: dict, key: str) -> None:
    curl = need_tool("curl")
    while (left := deadline - time.monotonic()) > 1:
        out = subprocess.run(
            [curl, "-s", "-o", "/dev/null", "-w", "%{http_code} %{size_download}", "--max-time", f"{left:.1f}",
             "-H", f"Authorization: Bearer {ADMIN_TOKEN}", url],
            capture_output=True,
            text=True,
        )
        code, _, size = out.stdout.partition(" ")
        results.setdefault(key, []).append((code, int(size or 0), out.returncode))


def sample_health(processes, deadline: float, samples: dict) -> None:
    with httpx.Client(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10) as client:
        while time.monotonic() < deadline:
            for p in processes:
                sent = time.monotonic()
                try:
                    body = client.get(p.url + "/health/ready").json()
                    lease = body["sharedDownloads"]["leaseSeconds"]
                except (httpx.HTTPError, ValueError, KeyError, TypeError):
                    lease = None
                samples[p.name].append((time.monotonic() - sent, lease))
            time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--pool-size", type=int, default=2)
    parser.add_argument("--curls", type=int, default=2, help="download loops per process")
    parser.add_argument("--connections", type=int, default=64, help="wrk connections per process")
    args = parser.parse_args()

    env = {
        "ARKVORY_DATABASE_POOL_SIZE": str(args.pool_size),
        "ARKVORY_MAX_DOWNLOADS": "128",
        "ARKVORY_MAX_DOWNLOADS_PER_PRINCIPAL": "128",
        "ARKVORY_DOWNLOAD_QUEUE_SIZE": "1024",
    }
    with BenchCluster() as bench:
        shared = bench.shared(slots=2, total=MAX_RATE)
        writer = bench.writer(shared, **env)
        create_repo(writer, "bench")
        big = upload(writer, "bench", "big.bin", 256 * MiB)
        small = upload(writer, "bench", "small.bin", 4096)
        gateway = bench.gateway(1, shared, **env)
        processes = [writer, gateway]
        cpu_before = {p.name: cpu_seconds(p.proc.pid) for p in processes}
        deadline = time.monotonic() + args.seconds
        downloads: dict[str, list] = {}
        health: dict[str, list] = {p.name: [] for p in processes}
        wrk_results: dict[str, dict] = {}
        threads = [
            threading.Thread(target=curl_loop, args=(p.url + big["path"], deadline, downloads, p.name), daemon=True)
            for p in processes
            for _ in range(args.curls)
        ]
        threads.append(threading.Thread(target=sample_health, args=(processes, deadline, health), daemon=True))
        auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        metadata_path = f"/api/v1/repositories/bench/artifacts/{small['id']}"
        wrk_jobs = {
            "writer: GET artifact metadata": (writer.url + metadata_path, auth),
            "gateway: GET content, Range 0-0": (gateway.url + small["path"], {**auth, "Range": "bytes=0-0"}),
        }

        def wrk_job(name, url, headers):
            wrk_results[name] = run_wrk(url, threads=1, connections=args.connections, seconds=args.seconds, headers=headers)

        threads += [threading.Thread(target=wrk_job, args=(name, *job), daemon=True) for name, job in wrk_jobs.items()]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(args.seconds + 60)
        elapsed = time.monotonic() - started
        cpu_used = {p.name: cpu_seconds(p.proc.pid) - cpu_before[p.name] for p in processes}
        found = {p.name: metrics(p) for p in processes}
        alive = {p.name: p.proc.poll() is None for p in processes}
        statuses = {p.name: p.status() for p in processes}

    rows = []
    bad_total = 0
    lost_total = 0
    for name, m in found.items():
        renewals = {k.split('"')[1]: int(v) for k, v in m.items() if k.startswith("arkvory_lease_renewals_total{")}
        lost = int(m.get("arkvory_leases_lost_total", 0))
        bad = sum(v for k, v in renewals.items() if k != "ok")
        lost_total += lost
        bad_total += bad
        lags = [lag for lag, _ in health[name]]
        leases = [lease for _, lease in health[name] if lease is not None]
        payload = m.get("arkvory_download_payload_bytes_total", 0)
        rows.append(
            (
                name,
                renewals.get("ok", 0),
                ", ".join(f"{k}: {v}" for k, v in sorted(renewals.items()) if k != "ok") or "0",
                lost,
                f"{min(leases):.2f}" if leases else "-",
                f"{max(lags) * 1000:.0f}" if lags else "-",
                f"{cpu_used[name] / elapsed:.2f}",
                f"{fmt_bytes(payload)} ({payload / elapsed / MiB:.0f} MiB/s)",
                "yes" if alive[name] and statuses[name] == (200, "ready") else f"NO {statuses[name]}",
            )
        )
    print()
    print(
        table(
            rows,
            (
                "process",
                "renewals ok",
                "renewals not ok",
                "leases lost",
                "min lease s left",
                "max /health/ready ms",
                "CPU (cores)",
                "payload sent",
                "ready after",
            ),
        )
    )
    wrk_rows = [
        (name, f"{r['rps']:.0f}", r["requests"], r["non2xx"], r["socket_errors"], f"{r['latency_mean_s'] * 1000:.0f}", f"{r['latency_max_s'] * 1000:.0f}")
        for name, r in wrk_results.items()
    ]
    for name, runs in sorted(downloads.items()):
        ok = sum(1 for code, size, rc in runs if code == "200" and size == big["size"])
        wrk_rows.append((f"{name}: curl 256 MiB downloads", "-", f"{ok} whole, {len(runs) - ok} cut at the deadline", "-", "-", "-", "-"))
    print()
    print(table(wrk_rows, ("pool load", "req/s", "requests", "non-2xx", "socket errors", "mean ms", "max ms")))
    print()
    print(
        table(
            [
                ("leases lost", lost_total, "0", verdict(lost_total == 0)),
                ("renewals failed/rejected/late", bad_total, "0", verdict(bad_total == 0)),
            ],
            ("figure", "value", "goal", "result"),
        )
    )
    print(
        f"\n({args.seconds} s; ARKVORY_DATABASE_POOL_SIZE={args.pool_size}; {args.curls} curl download loops "
        f"per process; wrk -t1 -c{args.connections} per process)"
    )
    if not all(alive.values()):
        print("ERROR: a server process exited during the run")
        return 1
    return 0


if __name__ == "__main__":
    bench_main("lease_under_load", 300, main)
