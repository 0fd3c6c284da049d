"""Authorized 64 KiB downloads: this tree's gateway and a reference tree's gateway (before/after)
beside the bare uvicorn app, in alternating rounds on one cluster (issue 14 §3).

On a host shared with other work the rate of a server moves ±30 % between runs a minute apart, so
a before/after pair measured in two runs says little. Here both gateways serve the same artifact
from the same database, and each round runs wrk against the gateway of this tree, the reference
gateway and the bare app (bench/bare_app.py) in turn, starting with the next one each round;
the table gives the median and range of each, the median of the per-round ratios to the bare
app, and the load average before and after.

The reference is any Python whose `arkvory` package is the other tree, e.g. a venv made for a
checkout of main:

    git worktree add /tmp/base main && python3 -m venv /tmp/base/.venv && \
        /tmp/base/.venv/bin/pip install -e /tmp/base
    .venv/bin/python bench/side_by_side.py --reference-python /tmp/base/.venv/bin/python

Without `--reference-python` it measures this tree against the bare app only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import httpx
from cluster import (
    ADMIN_TOKEN,
    MAX_RATE,
    ROOT,
    BenchCluster,
    BenchError,
    KiB,
    bench_main,
    blob_file,
    cpu_seconds,
    create_repo,
    machine,
    run_wrk,
    table,
    upload,
)
from small_requests import OPEN_ADMISSION, _free_port, _wait_listening

GOAL = 0.5  # issue 6 §6 and issue 14 §3, on every host
AIM = 0.8  # issue 14 §3: on this host, so that a host with ~1.6× slower Python clears GOAL


class ReferenceGateway:
    """`arkvory serve` (a gateway) run by another tree's Python, on the same cluster."""

    def __init__(self, python: str, env: dict[str, str], workdir) -> None:
        self.url = f"http://127.0.0.1:{env['ARKVORY_PORT']}"
        self._stderr = open(workdir / "reference-gateway.stderr", "wb")
        self.proc = subprocess.Popen(
            [python, "-m", "arkvory.shared.cli.main", "serve"],
            env=env, cwd="/", stdout=subprocess.DEVNULL, stderr=self._stderr,
        )
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise BenchError(f"the reference gateway exited {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/health/status", timeout=2).json().get("status") == "ready":
                    return
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise BenchError("the reference gateway was not ready within 60 s")
            time.sleep(0.2)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._stderr.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference-python", help="a Python whose `arkvory` is the reference tree")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=5, help="wrk duration of each measurement")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pool-size", type=int, default=10, help="ARKVORY_DATABASE_POOL_SIZE")
    args = parser.parse_args()
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    wrk = dict(threads=args.threads, connections=args.connections)
    load_before = os.getloadavg()
    with BenchCluster() as bench:
        shared = bench.shared(slots=3, total=MAX_RATE)
        pool = {"ARKVORY_DATABASE_POOL_SIZE": str(args.pool_size)}
        writer = bench.writer(shared, **pool)
        create_repo(writer, "bench")
        artifact = upload(writer, "bench", "small.bin", 64 * KiB)
        gateway = bench.gateway(1, shared, **pool, **OPEN_ADMISSION)
        servers: dict[str, tuple[str, dict, int]] = {
            "gateway (this tree)": (gateway.url + artifact["path"], auth, gateway.proc.pid),
        }
        reference = bare = None
        try:
            if args.reference_python:
                env = bench.cluster.base_env(
                    ARKVORY_ROLE="reader", ARKVORY_GATEWAY_SLOT="2", ARKVORY_PORT=str(_free_port()),
                    **shared, **pool, **OPEN_ADMISSION,
                )
                reference = ReferenceGateway(args.reference_python, env, bench.workdir)
                servers["gateway (reference)"] = (reference.url + artifact["path"], auth, reference.proc.pid)
            blob = blob_file(bench.data_dir, artifact["sha256"])
            bare_port = _free_port()
            bare = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "--app-dir", str(ROOT / "bench"), "bare_app:app",
                 "--host", "127.0.0.1", "--port", str(bare_port), "--no-access-log", "--log-level", "warning"],
                env={**os.environ, "BARE_APP_FILE": str(blob)},
            )
            _wait_listening(bare_port, bare)
            servers["bare uvicorn app"] = (f"http://127.0.0.1:{bare_port}/", {}, bare.pid)
            for url, headers, _ in servers.values():
                run_wrk(url, headers=headers, seconds=2, **wrk)  # warm-up
            rates: dict[str, list[float]] = {name: [] for name in servers}
            cpu: dict[str, list[float]] = {name: [] for name in servers}
            order = list(servers)
            for round_ in range(args.rounds):
                shift = round_ % len(order)
                for name in order[shift:] + order[:shift]:
                    url, headers, pid = servers[name]
                    before = cpu_seconds(pid)
                    result = run_wrk(url, headers=headers, seconds=args.seconds, **wrk)
                    if result["non2xx"] or result["socket_errors"]:
                        raise BenchError(f"{name}: {result['non2xx']} non-2xx, {result['socket_errors']} socket errors")
                    rates[name].append(result["rps"])
                    cpu[name].append((cpu_seconds(pid) - before) / max(result["requests"], 1))
        finally:
            if reference is not None:
                reference.close()
            if bare is not None:
                bare.terminate()
                bare.wait(10)
    load_after = os.getloadavg()
    bare_rates = rates["bare uvicorn app"]
    rows = []
    for name in servers:
        ratios = [rate / floor for rate, floor in zip(rates[name], bare_rates)]
        rows.append((
            name,
            f"{statistics.median(rates[name]):,.0f}",
            f"{min(rates[name]):,.0f}–{max(rates[name]):,.0f}",
            f"{statistics.median(cpu[name]) * 1e6:.0f}",
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})" if name != "bare uvicorn app" else "1",
        ))
    print()
    print(table(rows, ("server", "req/s (median)", "range", "CPU µs/req (median)", "× bare app, per round: median (range)")))
    if "gateway (reference)" in rates:
        # The before/after figure itself: both gateways measured in the same round.
        pairs = [mine / theirs for mine, theirs in zip(rates["gateway (this tree)"], rates["gateway (reference)"])]
        cpu_pairs = [mine / theirs for mine, theirs in zip(cpu["gateway (this tree)"], cpu["gateway (reference)"])]
        print(
            f"\nthis tree / reference, per round: req/s {statistics.median(pairs):.2f} "
            f"({min(pairs):.2f}–{max(pairs):.2f}), CPU per request {statistics.median(cpu_pairs):.2f} "
            f"({min(cpu_pairs):.2f}–{max(cpu_pairs):.2f})"
        )
    print(f"\ngoal ≥ {GOAL} × the bare app on every host; aim here ≥ {AIM}")
    print(
        f"({args.rounds} alternating rounds of wrk -t{args.threads} -c{args.connections} -d{args.seconds}s, "
        f"64 KiB body; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; {machine()})"
    )
    return 0


if __name__ == "__main__":
    bench_main("side_by_side", 1800, main)
