"""Single-stream throughput of a 1 GiB artifact: a gateway vs nginx on the same blob file, and,
with `--reference-python`, another tree's gateway (before/after) in the same rounds.

Goals: the gateway at least as fast as nginx (issue 14: ≥ 1.0 ×), with at most 1.5 × nginx's
server CPU per GiB (issue 26; issue 6 asked 2 ×).

The gateways run in shared mode with the largest total the settings accept (2^40 B/s over 3
slots), so a share never limits them: as unthrottled as a gateway can be. The client is curl
writing to /dev/null; the blob is in the page cache (read once before measuring). Server CPU is
every thread's time from the scheduler's nanosecond counters (nginx: master and worker) around
each download. Each round downloads once from every server, starting with the next server each
round; the table gives medians and ranges, and the median of the per-round ratios to nginx (on
a host shared with other work, figures move ±50 % between rounds a minute apart: only a ratio
within a round means much).

    .venv/bin/python bench/throughput.py [--size-mib 1024] [--runs 7] [--reference-python OTHER/.venv/bin/python]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess

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
    create_repo,
    exact_cpu_seconds,
    machine,
    need_tool,
    table,
    upload,
    verdict,
    warm_page_cache,
)
from side_by_side import ReferenceGateway
from small_requests import _free_port

RATE_GOAL = 1.0
CPU_GOAL = 1.5


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


def spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=7, help="rounds (one download from each server per round)")
    parser.add_argument("--reference-python", help="a Python whose `arkvory` is the reference tree")
    args = parser.parse_args()
    size = args.size_mib * MiB
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    load_before = os.getloadavg()

    with BenchCluster() as bench:
        shared = bench.shared(slots=3, total=MAX_RATE)
        writer = bench.writer(shared)
        create_repo(writer, "bench")
        artifact = upload(writer, "bench", "big.bin", size)
        gateway = bench.gateway(1, shared)
        blob = blob_file(bench.data_dir, artifact["sha256"])
        warm_page_cache(blob)
        nginx = Nginx(bench.data_dir, bench.workdir)
        reference = None
        try:
            servers = {"gateway (this tree)": (gateway.url + artifact["path"], auth, lambda: [gateway.proc.pid])}
            if args.reference_python:
                env = bench.cluster.base_env(
                    ARKVORY_ROLE="reader", ARKVORY_GATEWAY_SLOT="2", ARKVORY_PORT=str(_free_port()), **shared
                )
                reference = ReferenceGateway(args.reference_python, env, bench.workdir)
                servers["gateway (reference)"] = (reference.url + artifact["path"], auth, lambda: [reference.proc.pid])
            servers["nginx (sendfile on, 1 worker)"] = (
                nginx.url + "/" + str(blob.relative_to(bench.data_dir)), {}, nginx.pids
            )
            for url, headers, _ in servers.values():  # a warm-up each (connections, lazy imports)
                curl_download(url, headers, size, timeout=300)
            rates: dict[str, list[float]] = {name: [] for name in servers}
            cpu: dict[str, list[float]] = {name: [] for name in servers}
            order = list(servers)
            for round_ in range(args.runs):
                shift = round_ % len(order)
                for name in order[shift:] + order[:shift]:
                    url, headers, pids = servers[name]
                    before = exact_cpu_seconds(pids())
                    seconds, got = curl_download(url, headers, size, timeout=300)
                    used = exact_cpu_seconds(pids()) - before
                    rates[name].append(got / seconds / MiB)
                    cpu[name].append(used / (got / GiB))
        finally:
            if reference is not None:
                reference.close()
            nginx.close()
    load_after = os.getloadavg()

    nginx_name = order[-1]
    rows = []
    for name in servers:
        rate_ratios = [mine / theirs for mine, theirs in zip(rates[name], rates[nginx_name])]
        cpu_ratios = [mine / theirs for mine, theirs in zip(cpu[name], cpu[nginx_name])]
        mine = name != nginx_name
        rows.append((
            name, spread(rates[name], ",.0f"), spread(cpu[name], ".3f"),
            spread(rate_ratios, ".2f") if mine else "1", spread(cpu_ratios, ".2f") if mine else "1",
        ))
    print()
    print(table(rows, (
        "server", "MiB/s: median (range)", "server CPU s/GiB", "× nginx MiB/s, per round", "× nginx CPU/GiB, per round",
    )))
    ours = order[0]
    rate_ratio = statistics.median(m / n for m, n in zip(rates[ours], rates[nginx_name]))
    cpu_ratio = statistics.median(m / n for m, n in zip(cpu[ours], cpu[nginx_name]))
    print()
    print(table(
        [
            ("throughput gateway / nginx", f"{rate_ratio:.2f}", f"≥ {RATE_GOAL:.2f}", verdict(rate_ratio >= RATE_GOAL)),
            ("CPU per GiB gateway / nginx", f"{cpu_ratio:.2f}", f"≤ {CPU_GOAL:.2f}", verdict(cpu_ratio <= CPU_GOAL)),
        ],
        ("figure (median of the rounds' ratios)", "ratio", "goal", "result"),
    ))
    if reference is not None:
        ref = "gateway (reference)"
        print(
            f"\nthis tree / reference, per round: MiB/s {spread([m / t for m, t in zip(rates[ours], rates[ref])], '.2f')}, "
            f"CPU per GiB {spread([m / t for m, t in zip(cpu[ours], cpu[ref])], '.2f')}"
        )
    print(
        f"\n({args.runs} alternating rounds of one {size // MiB} MiB download per server, after a warm-up each;"
        f" client: curl -o /dev/null; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; {machine()})"
    )
    return 0


if __name__ == "__main__":
    bench_main("throughput", 1800, main)
