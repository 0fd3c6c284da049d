"""The shared download budget under load: writer + 2 gateways, total 3 × 8 MiB/s, 64 clients.

Goals (issue):
  * total delivered ≥ 99 % of (configured total × time) over the measured window;
  * never above `rate × t + burst × slots` at any sampled moment (t from the start of the load);
  * per-client fairness: min/max of bytes received per client ≥ 0.9.

Each client has its own key (its own principal), downloads a large artifact over and over from
one process (clients spread round-robin over writer, gateway 1, gateway 2) and counts body bytes
as they arrive. A sampler records every client's count every 100 ms and each process's
`grantedBytes` (/health/ready) every 250 ms. The server-side check is per process and
conservative about sampling delays: between two readings i < j, granted bytes must be
≤ share × (answer time of j − send time of i) + burst.

With `--share-mode demand` (issue 23) the processes divide the same total by their demand:
the server-side check is then made on all processes together (Σ granted ≤ total × Δt + the
bursts), since a process's share moves.

    .venv/bin/python bench/throttled.py [--seconds 15] [--clients 64] [--share-mib 8] [--share-mode static|demand]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx

from cluster import (
    ADMIN_TOKEN,
    BenchCluster,
    BenchError,
    HttpAnswer,
    MiB,
    bench_main,
    create_repo,
    fmt_bytes,
    reader_tokens,
    stream_get,
    table,
    upload,
    verdict,
)

WARMUP_S = 1.0


async def client_loop(url: str, path: str, token: str, counter: list, stop: asyncio.Event, errors: list) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    while not stop.is_set():
        answer = HttpAnswer()
        task = asyncio.ensure_future(stream_get(url, path, headers, answer, counter=counter))
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return
        if answer.status != 200 or answer.error:
            errors.append(f"{url}: HTTP {answer.status} {answer.error or ''} {answer.headers.get('retry-after', '')}")
            await asyncio.sleep(1)


async def sample_granted(processes, samples: dict, stop: asyncio.Event) -> None:
    """(sent, answered, grantedBytes) per process, every 250 ms."""
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=5) as client:
        while not stop.is_set():
            for process in processes:
                sent = time.monotonic()
                body = (await client.get(process.url + "/health/ready")).json()
                answered = time.monotonic()
                granted = body["transfers"]["downloads"]["bandwidth"]["grantedBytes"]
                samples[process.name].append((sent, answered, granted))
            await asyncio.sleep(0.25)


async def run_load(processes, path: str, tokens: list[str], seconds: float):
    counters = [[0] for _ in tokens]
    stop = asyncio.Event()
    errors: list[str] = []
    client_samples: list[tuple[float, list[int]]] = []
    granted: dict[str, list] = {p.name: [] for p in processes}
    sampler = asyncio.ensure_future(sample_granted(processes, granted, stop))
    await asyncio.sleep(0.6)  # the first readings: nothing granted yet
    t0 = time.monotonic()
    clients = [
        asyncio.ensure_future(client_loop(processes[i % len(processes)].url, path, token, counters[i], stop, errors))
        for i, token in enumerate(tokens)
    ]
    end = t0 + WARMUP_S + seconds
    while (now := time.monotonic()) < end:
        client_samples.append((now, [c[0] for c in counters]))
        await asyncio.sleep(0.1)
    client_samples.append((time.monotonic(), [c[0] for c in counters]))
    stop.set()
    await asyncio.gather(*clients, sampler, return_exceptions=True)
    return t0, client_samples, granted, errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--share-mib", type=float, default=8.0, help="each process's share, MiB/s")
    parser.add_argument("--size-mib", type=int, default=64, help="artifact size")
    parser.add_argument("--share-mode", choices=("static", "demand"), default="static",
                        help="ARKVORY_SHARE_MODE for every process")
    args = parser.parse_args()
    slots = 3
    share = int(args.share_mib * MiB)
    total = share * slots
    burst = min(share // 10, MiB)
    keys = reader_tokens(args.clients)
    per_process = -(-args.clients // slots)
    admission = {"ARKVORY_MAX_DOWNLOADS": str(max(16, per_process + 4))}

    with BenchCluster(keys=keys) as bench:
        shared = bench.shared(slots=slots, total=total, ARKVORY_SHARE_MODE=args.share_mode)
        writer = bench.writer(shared, **admission)
        create_repo(writer, "bench")
        artifact = upload(writer, "bench", "large.bin", args.size_mib * MiB)
        processes = [writer] + [bench.gateway(slot, shared, **admission) for slot in (1, 2)]
        t0, client_samples, granted, errors = asyncio.run(
            run_load(processes, artifact["path"], list(keys), args.seconds)
        )

    if not client_samples or len(client_samples) < 3:
        raise BenchError("no samples were taken")
    # Measured window: after the warm-up, to the end.
    start = next(s for s in client_samples if s[0] >= t0 + WARMUP_S)
    last = client_samples[-1]
    window = last[0] - start[0]
    per_client = [b - a for a, b in zip(start[1], last[1])]
    delivered = sum(per_client)
    expected = total * window
    delivery_ratio = delivered / expected
    fairness = min(per_client) / max(per_client) if max(per_client) else 0.0

    # Client side, cumulative since t0 (before any request was sent).
    allowance = burst * slots
    worst = max((sum(counts) - total * (t - t0)) for t, counts in client_samples)
    cumulative_ok = worst <= allowance

    # Server side, per process, every pair of readings (conservative brackets).
    server_rows = []
    server_ok = True
    server_window_granted = 0
    static = args.share_mode == "static"
    for name, samples in granted.items():
        worst_excess = -float("inf")
        for i, (sent_i, _, g_i) in enumerate(samples):
            for _, answered_j, g_j in samples[i + 1 :]:
                worst_excess = max(worst_excess, (g_j - g_i) - (share * (answered_j - sent_i) + burst))
        if not static:
            worst_excess = 0  # a process's share moves: only all of them together are bounded
        inside = [s for s in samples if start[0] <= s[0] <= last[0]]
        rate = (inside[-1][2] - inside[0][2]) / (inside[-1][0] - inside[0][0]) if len(inside) > 1 else 0.0
        server_window_granted += inside[-1][2] - inside[0][2] if len(inside) > 1 else 0
        server_ok &= worst_excess <= 0
        server_rows.append(
            (name, f"{rate / MiB:.3f}", f"{rate / share:.4f}",
             "-" if not static else fmt_bytes(worst_excess) if worst_excess > 0 else "none")
        )
    # All processes together, every pair of sampling rounds (a round reads the three in turn).
    rounds = [
        (min(s for s, _, _ in row), max(a for _, a, _ in row), sum(g for _, _, g in row))
        for row in zip(*granted.values())
    ]
    together_excess = max(
        (g_j - g_i) - (total * (answered_j - sent_i) + burst * slots)
        for i, (sent_i, _, g_i) in enumerate(rounds)
        for _, answered_j, g_j in rounds[i + 1 :]
    )
    server_ok &= together_excess <= 0

    print()
    print(table(server_rows, ("process", "granted MiB/s (window)", "of share", "worst excess over share×Δt+burst")))
    clients_by_process = {}
    for i, bytes_ in enumerate(per_client):
        clients_by_process.setdefault(i % slots, []).append(bytes_)
    print()
    print(
        table(
            [
                (
                    ["writer", "gateway1", "gateway2"][k],
                    len(v),
                    fmt_bytes(min(v)),
                    fmt_bytes(max(v)),
                    f"{min(v) / max(v):.3f}" if max(v) else "-",
                )
                for k, v in sorted(clients_by_process.items())
            ],
            ("process", "clients", "min bytes/client", "max bytes/client", "min/max"),
        )
    )
    sizes = [len(v) for v in clients_by_process.values()]
    split_bound = min(sizes) / max(sizes)
    print()
    print(
        table(
            [
                (
                    "delivered / (total × time)",
                    f"{delivery_ratio:.4f} ({fmt_bytes(delivered)} in {window:.2f} s, total {fmt_bytes(total)}/s)",
                    "≥ 0.99",
                    verdict(delivery_ratio >= 0.99),
                ),
                (
                    "max over samples of received − total × t",
                    f"{fmt_bytes(worst)} (allowance burst × slots = {fmt_bytes(allowance)})",
                    "≤ burst × slots",
                    verdict(cumulative_ok),
                ),
                (
                    "server-side: granted in any sampled interval",
                    ("within share × Δt + burst per process, " if static else "")
                    + ("all together within total × Δt + bursts" if together_excess <= 0
                       else f"all together EXCEEDED by {fmt_bytes(together_excess)}")
                    if server_ok else "EXCEEDED (see above)",
                    "≤ share × Δt + burst" if static else "≤ total × Δt + burst × slots",
                    verdict(server_ok),
                ),
                (
                    "fairness min/max bytes per client",
                    f"{fairness:.3f} ({'/'.join(str(len(v)) for _, v in sorted(clients_by_process.items()))} clients per process; "
                    + (f"best possible, each process having its own share: {split_bound:.3f})" if static
                       else "demand shares divide the total by downloads)"),
                    "≥ 0.9",
                    verdict(fairness >= 0.9),
                ),
                ("errors (non-200 or cut bodies)", str(len(errors)), "0", verdict(not errors)),
            ],
            ("figure", "value", "goal", "result"),
        )
    )
    print(
        f"\n({args.clients} clients, each its own key, over writer + 2 gateways; {args.share_mode} shares, static share {fmt_bytes(share)}/s "
        f"per process, burst {fmt_bytes(burst)}; {args.seconds:.0f} s measured after {WARMUP_S:.0f} s warm-up; "
        f"server-side granted over the window: {fmt_bytes(server_window_granted)})"
    )
    for line in errors[:10]:
        print("error:", line)
    return 1 if errors else 0


if __name__ == "__main__":
    bench_main("throttled", 300, main)
