"""1,000 concurrent throttled downloads on one gateway: memory and errors.

Goal (issue): RSS of the gateway (VmHWM, peak resident set, from /proc) under 150 MiB, no errors.

The gateway runs with the most the settings allow: ARKVORY_MAX_DOWNLOADS=256 sending at once and
ARKVORY_DOWNLOAD_QUEUE_SIZE=1024 waiting, with a queue timeout of 120 s so every waiter gets its
turn (the default 20 s would turn the tail of the queue into `503 busy`, by design). Its share is
--share-mib MiB/s; 1,000 clients (each its own key) open their connections at once and each
downloads a --size-mib MiB artifact to the end. The table shows how many were admitted at once
and how many waited, sampled from /health/ready every 0.25 s, and the gateway's RSS sampled
every 0.1 s.

    .venv/bin/python bench/many_downloads.py [--clients 1000] [--share-mib 32] [--size-mib 1]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time

import httpx

from cluster import (
    ADMIN_TOKEN,
    BenchCluster,
    HttpAnswer,
    KiB,
    MiB,
    bench_main,
    create_repo,
    fmt_bytes,
    memory_kib,
    reader_tokens,
    stream_get,
    table,
    upload,
    verdict,
)

GOAL_RSS_KIB = 150 * 1024


def raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))


async def run(gateway, path: str, tokens: list[str], size: int, limit_s: float):
    pid = gateway.proc.pid
    answers = [HttpAnswer() for _ in tokens]
    rss: list[tuple[float, int]] = []
    admission: list[tuple[float, int, int]] = []
    done = asyncio.Event()

    async def watch_memory():
        while not done.is_set():
            rss.append((time.monotonic(), memory_kib(pid)["VmRSS"]))
            await asyncio.sleep(0.1)

    async def watch_admission():
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10) as client:
            while not done.is_set():
                body = (await client.get(gateway.url + "/health/ready")).json()
                a = body["transfers"]["downloads"]["admission"]
                admission.append((time.monotonic(), a["active"], a["waiting"]))
                await asyncio.sleep(0.25)

    watchers = [asyncio.ensure_future(watch_memory()), asyncio.ensure_future(watch_admission())]
    await asyncio.sleep(0.5)
    started = time.monotonic()
    connected = [asyncio.Event() for _ in tokens]
    downloads = [
        asyncio.ensure_future(
            stream_get(gateway.url, path, {"Authorization": f"Bearer {t}"}, a, read_size=64 * KiB, connected=c)
        )
        for t, a, c in zip(tokens, answers, connected)
    ]
    await asyncio.wait([asyncio.ensure_future(c.wait()) for c in connected], timeout=30)
    all_sent = time.monotonic() - started
    finished, pending = await asyncio.wait(downloads, timeout=limit_s)
    elapsed = time.monotonic() - started
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    done.set()
    await asyncio.gather(*watchers, return_exceptions=True)
    return answers, rss, admission, elapsed, all_sent, len(pending)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--share-mib", type=float, default=32.0, help="the gateway's share, MiB/s")
    parser.add_argument("--size-mib", type=float, default=1.0, help="artifact size")
    args = parser.parse_args()
    raise_fd_limit(args.clients * 2 + 512)
    size = int(args.size_mib * MiB)
    share = int(args.share_mib * MiB)
    keys = reader_tokens(args.clients)
    expected_s = args.clients * size / share
    limit_s = expected_s * 1.5 + 30
    gateway_env = {
        "ARKVORY_MAX_DOWNLOADS": "256",
        "ARKVORY_DOWNLOAD_QUEUE_SIZE": "1024",
        "ARKVORY_DOWNLOAD_QUEUE_TIMEOUT_MS": "120000",
    }
    with BenchCluster(keys=keys) as bench:
        shared = bench.shared(slots=2, total=2 * share)
        writer = bench.writer(shared)
        create_repo(writer, "bench")
        artifact = upload(writer, "bench", "one.bin", size)
        gateway = bench.gateway(1, shared, **gateway_env)
        idle = memory_kib(gateway.proc.pid)
        answers, rss, admission, elapsed, all_sent, unfinished = asyncio.run(
            run(gateway, artifact["path"], list(keys), size, limit_s)
        )
        after = memory_kib(gateway.proc.pid)
        stderr_tail = gateway.stderr[-2000:]

    statuses: dict[int, int] = {}
    for a in answers:
        statuses[a.status] = statuses.get(a.status, 0) + 1
    errors = [a for a in answers if a.status != 200 or a.error or a.received != size]
    peak_rss = max([after["VmHWM"], *(r for _, r in rss)])
    max_active = max((a for _, a, _ in admission), default=0)
    max_waiting = max((w for _, _, w in admission), default=0)
    max_both = max((a + w for _, a, w in admission), default=0)
    delivered = sum(a.received for a in answers)

    print()
    print(
        table(
            [
                ("gateway RSS idle (before load)", f"{idle['VmRSS'] / 1024:.1f} MiB"),
                ("gateway RSS peak (VmHWM)", f"{peak_rss / 1024:.1f} MiB"),
                ("gateway RSS after load", f"{after['VmRSS'] / 1024:.1f} MiB"),
                ("downloads started / completed", f"{len(answers)} / {len(answers) - len(errors)}"),
                ("all requests sent after", f"{all_sent:.2f} s"),
                ("max admitted at once (sampled)", max_active),
                ("max waiting at once (sampled)", max_waiting),
                ("max admitted + waiting (sampled)", max_both),
                ("HTTP statuses", ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items()))),
                ("delivered", f"{fmt_bytes(delivered)} in {elapsed:.1f} s = {delivered / elapsed / MiB:.2f} MiB/s (share {fmt_bytes(share)}/s)"),
            ],
            ("figure", "value"),
        )
    )
    print()
    print(
        table(
            [
                ("gateway peak RSS", f"{peak_rss / 1024:.1f} MiB", "< 150 MiB", verdict(peak_rss < GOAL_RSS_KIB)),
                ("errors (non-200, cut, unfinished)", str(len(errors)), "0", verdict(not errors)),
            ],
            ("figure", "value", "goal", "result"),
        )
    )
    print(
        f"\n({args.clients} clients, each its own key, one connection each; artifact {fmt_bytes(size)}; "
        "ARKVORY_MAX_DOWNLOADS=256, ARKVORY_DOWNLOAD_QUEUE_SIZE=1024, queue timeout 120 s)"
    )
    if errors:
        for a in errors[:10]:
            print(f"error: HTTP {a.status} {a.error or ''} received {a.received}")
        if unfinished:
            print(f"error: {unfinished} downloads unfinished after {limit_s:.0f} s")
        print("gateway stderr (tail):\n" + stderr_tail)
        return 1
    return 0


if __name__ == "__main__":
    bench_main("many_downloads", 400, main)
