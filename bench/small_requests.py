"""Authorized 64 KiB downloads from one gateway vs nginx serving the same blob file, with wrk.

Goals (issue 6 §6, raised by issue 26): gateway req/s ≥ 0.7 × a bare uvicorn app serving the same file
(`bench/bare_app.py`, uvicorn's defaults for the installed extras) and ≥ 0.15 × nginx req/s
(64 connections, 2 wrk threads, ~10 s).

The gateway is effectively unthrottled (total 2^40 B/s) and its admission is opened up so that
it is not the limit (ARKVORY_MAX_DOWNLOADS=256, per principal 256, queue 1024). A second gateway
row uses the default admission settings (16 at once, 4 per principal, queue 64) with the same
single key, to show what admission costs. Every gateway request authenticates (Bearer key) and
runs two catalog queries (repository, artifact) on the database pool.
nginx runs with 1 worker (one process, like the gateway) and with `auto` (one per CPU).

`--share-mode demand` runs every process with demand shares (issue 23: nothing may be added per
request or per chunk, so the figure must not fall).

`--access-log text json` measures the access log instead (issue 24 item 4, goal: ≥ 0.9 × the rate
without it): open-admission gateways on one cluster, one with `ARKVORY_ACCESS_LOG` off and one per
format named, in `--rounds` rounds of wrk against each in turn, each round starting with the next
gateway; it prints each one's median and range, the median of the per-round ratios to off, the
CPU per request each adds, and the lines written and dropped (nothing else is measured then).

    .venv/bin/python bench/small_requests.py [--seconds 10] [--connections 64] [--share-mode static|demand]
    .venv/bin/python bench/small_requests.py --access-log text json [--rounds 7] [--seconds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import time

from cluster import (
    ADMIN_TOKEN,
    MAX_RATE,
    ROOT,
    BenchCluster,
    BenchError,
    KiB,
    Nginx,
    bench_main,
    blob_file,
    cpu_seconds,
    create_repo,
    machine,
    metrics,
    table,
    tree_cpu_seconds,
    run_wrk,
    upload,
    verdict,
)

OPEN_ADMISSION = {
    "ARKVORY_MAX_DOWNLOADS": "256",
    "ARKVORY_MAX_DOWNLOADS_PER_PRINCIPAL": "256",
    "ARKVORY_DOWNLOAD_QUEUE_SIZE": "1024",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--size-kib", type=int, default=64)
    parser.add_argument("--pool-size", type=int, default=10, help="ARKVORY_DATABASE_POOL_SIZE")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for both gateways (repeatable), e.g. to try a setting",
    )
    parser.add_argument("--share-mode", choices=("static", "demand"), default="static",
                        help="ARKVORY_SHARE_MODE for every process")
    parser.add_argument(
        "--py-spy",
        metavar="FILE",
        help="record the open-admission gateway with py-spy during its run (FILE.svg: flame graph, "
        "FILE.txt: collapsed stacks; sampling slows the gateway a little); needs `.venv/bin/pip install py-spy`",
    )
    parser.add_argument("--access-log", choices=("text", "json"), nargs="+",
                        help="measure a gateway with each access log format beside one without (only that)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of --access-log")
    args = parser.parse_args()
    if args.access_log:
        return access_log_cost(args)
    size = args.size_kib * KiB
    wrk_args = dict(threads=args.threads, connections=args.connections, seconds=args.seconds)
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    results: dict[str, dict] = {}
    with BenchCluster() as bench:
        shared = bench.shared(slots=3, total=MAX_RATE, ARKVORY_SHARE_MODE=args.share_mode)
        pool = {"ARKVORY_DATABASE_POOL_SIZE": str(args.pool_size)}
        extra = dict(item.split("=", 1) for item in args.env)
        writer = bench.writer(shared, **pool)
        create_repo(writer, "bench")
        artifact = upload(writer, "bench", "small.bin", size)
        gateway = bench.gateway(1, shared, **{**pool, **OPEN_ADMISSION, **extra})
        default_gateway = bench.gateway(2, shared, **{**pool, **extra})
        blob = blob_file(bench.data_dir, artifact["sha256"])
        blob_url = "/" + str(blob.relative_to(bench.data_dir))

        def measure(name: str, url: str, headers: dict, cpu, profile_pid: int | None = None) -> None:
            run_wrk(url, headers=headers, threads=args.threads, connections=args.connections, seconds=2)  # warm-up
            spies = start_py_spy(profile_pid) if profile_pid else []
            before = cpu()
            result = run_wrk(url, headers=headers, **wrk_args)
            result["cpu"] = cpu() - before
            for spy in spies:
                spy.wait(30)
            results[name] = result

        def start_py_spy(pid: int) -> list:
            if not args.py_spy:
                return []
            spy = ROOT / ".venv" / "bin" / "py-spy"
            if not spy.exists():
                raise BenchError("py-spy is not installed: .venv/bin/pip install py-spy")
            return [
                subprocess.Popen(
                    [str(spy), "record", "-p", str(pid), "-d", str(max(1, args.seconds - 1)), "-r", "200",
                     "-f", fmt, "-o", f"{args.py_spy}.{ext}"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                for fmt, ext in (("flamegraph", "svg"), ("raw", "txt"))
            ]

        measure(
            "gateway, admission 256/256/1024",
            gateway.url + artifact["path"],
            auth,
            lambda: cpu_seconds(gateway.proc.pid),
            profile_pid=gateway.proc.pid,
        )
        measure(
            "gateway, default admission 16/4/64",
            default_gateway.url + artifact["path"],
            auth,
            lambda: cpu_seconds(default_gateway.proc.pid),
        )
        bare_port = _free_port()
        bare = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--app-dir", str(ROOT / "bench"), "bare_app:app",
             "--host", "127.0.0.1", "--port", str(bare_port), "--no-access-log", "--log-level", "warning"],
            env={**os.environ, "BARE_APP_FILE": str(blob)},
        )
        try:
            _wait_listening(bare_port, bare)
            measure(
                "bare uvicorn app (pread + send)",
                f"http://127.0.0.1:{bare_port}/",
                {},
                lambda: cpu_seconds(bare.pid),
            )
        finally:
            bare.terminate()
            bare.wait(10)
        for workers in ("1", "auto"):
            nginx = Nginx(bench.data_dir, bench.workdir, workers=workers)
            try:
                measure(
                    f"nginx static, worker_processes {workers}",
                    nginx.url + blob_url,
                    {},
                    lambda: tree_cpu_seconds(nginx.pids()),
                )
            finally:
                nginx.close()

    rows = []
    for name, r in results.items():
        rows.append(
            (
                name,
                f"{r['rps']:.0f}",
                r["requests"],
                r["non2xx"],
                r["socket_errors"],
                f"{r['latency_mean_s'] * 1000:.1f}",
                f"{r['latency_max_s'] * 1000:.0f}",
                f"{r['cpu'] / max(r['requests'], 1) * 1e6:.0f}",
            )
        )
    print()
    print(
        table(
            rows,
            ("server", "req/s", "requests", "non-2xx", "socket errors", "mean ms", "max ms", "server CPU µs/req"),
        )
    )
    names = list(results)
    gw = results[names[0]]["rps"]
    ratios = []
    bare_ratio = gw / results[names[2]]["rps"]
    ratios.append((f"gateway (open admission) / {names[2]}", f"{bare_ratio:.3f}", "≥ 0.7", verdict(bare_ratio >= 0.7)))
    for nginx_name in names[3:]:
        ratio = gw / results[nginx_name]["rps"]
        ratios.append((f"gateway (open admission) / {nginx_name}", f"{ratio:.3f}", "≥ 0.15", verdict(ratio >= 0.15)))
    print()
    print(table(ratios, ("figure", "ratio", "goal", "result")))
    print(
        f"\n(wrk -t{args.threads} -c{args.connections} -d{args.seconds}s, {args.size_kib} KiB body, "
        f"after a 2 s warm-up each; ARKVORY_DATABASE_POOL_SIZE={args.pool_size})"
    )
    if results[names[0]]["non2xx"] or results[names[0]]["socket_errors"]:
        print("ERROR: the open-admission gateway answered errors", flush=True)
        return 1
    return 0


ACCESS_LOG_GOAL = 0.9


def access_log_cost(args: argparse.Namespace) -> int:
    """A gateway with the access log off beside one per asked format, in rounds that each start
    with the next of them (module docstring)."""
    size = args.size_kib * KiB
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    wrk = dict(threads=args.threads, connections=args.connections)
    load_before = os.getloadavg()
    modes = ["off", *dict.fromkeys(args.access_log)]
    with BenchCluster() as bench:
        shared = bench.shared(slots=len(modes) + 1, total=MAX_RATE, ARKVORY_SHARE_MODE=args.share_mode)  # (the writer is slot 0)
        pool = {"ARKVORY_DATABASE_POOL_SIZE": str(args.pool_size)}
        extra = dict(item.split("=", 1) for item in args.env)
        writer = bench.writer(shared, **pool)
        create_repo(writer, "bench")
        artifact = upload(writer, "bench", "small.bin", size)
        gateways = {
            mode: bench.gateway(slot, shared, **{**pool, **OPEN_ADMISSION, **extra, "ARKVORY_ACCESS_LOG": mode})
            for slot, mode in enumerate(modes, start=1)
        }
        for gateway in gateways.values():
            run_wrk(gateway.url + artifact["path"], headers=auth, seconds=2, **wrk)  # warm-up
        rates: dict[str, list[float]] = {mode: [] for mode in modes}
        cpu: dict[str, list[float]] = {mode: [] for mode in modes}
        for round_ in range(args.rounds):
            turn = round_ % len(modes)
            for mode in modes[turn:] + modes[:turn]:
                gateway = gateways[mode]
                before = cpu_seconds(gateway.proc.pid)
                result = run_wrk(gateway.url + artifact["path"], headers=auth, seconds=args.seconds, **wrk)
                if result["non2xx"] or result["socket_errors"]:
                    raise BenchError(f"{mode}: {result['non2xx']} non-2xx, {result['socket_errors']} socket errors")
                rates[mode].append(result["rps"])
                cpu[mode].append((cpu_seconds(gateway.proc.pid) - before) / max(result["requests"], 1))
        time.sleep(0.5)  # the lines are written every 0.1 s
        dropped = {mode: metrics(gateways[mode]).get("arkvory_access_log_dropped_lines_total", float("nan")) for mode in modes}
        written = {mode: sum(1 for line in gateways[mode].stderr.splitlines() if "arkvory.access" in line) for mode in modes}
    load_after = os.getloadavg()
    rows = [
        (
            f"access log {mode}",
            f"{statistics.median(rates[mode]):,.0f}",
            f"{min(rates[mode]):,.0f}–{max(rates[mode]):,.0f}",
            f"{statistics.median(cpu[mode]) * 1e6:.0f}",
            f"{written[mode]:,}",
            f"{dropped[mode]:.0f}",
        )
        for mode in modes
    ]
    print()
    print(table(rows, ("gateway", "req/s (median)", "range", "CPU µs/req (median)", "lines", "dropped")))
    figures = []
    for mode in modes[1:]:
        ratios = [on / off for off, on in zip(rates["off"], rates[mode])]
        cpu_added = [(on - off) * 1e6 for off, on in zip(cpu["off"], cpu[mode])]
        ratio = statistics.median(ratios)
        figures.append((
            f"{mode} / off, per round", f"{ratio:.3f} ({min(ratios):.2f}–{max(ratios):.2f})",
            f"{statistics.median(cpu_added):+.1f} ({min(cpu_added):+.1f}–{max(cpu_added):+.1f})",
            f"≥ {ACCESS_LOG_GOAL}", verdict(ratio >= ACCESS_LOG_GOAL and not dropped[mode]),
        ))
    print()
    print(table(figures, ("figure", "rate ratio, median (range)", "CPU µs/req added", "goal", "result")))
    print(
        f"\n({args.rounds} rounds of wrk -t{args.threads} -c{args.connections} -d{args.seconds}s per gateway, "
        f"each round starting with the next gateway, {args.size_kib} KiB body, after a 2 s warm-up each; "
        f"a figure counts only when no line was dropped; load average {load_before[0]:.2f} before, "
        f"{load_after[0]:.2f} after; {machine()})"
    )
    return 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"the bare uvicorn app exited {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise BenchError("the bare uvicorn app did not listen within 15 s")


if __name__ == "__main__":
    bench_main("small_requests", 300, main)
