"""Demand shares with real processes (issue 23), each figure beside static mode on the same
machine in the same run: writer + 2 gateways, total 24 MiB/s.

Parts (`--parts`, all by default; each runs in `static` and in `demand` mode):
  * busy      one download through gateway 1 alone: seconds until it gets ≥ 0.9 of the total
              (goal ≤ 5 s) and whether it holds (its lowest 1 s rate after that; static: 1/3);
  * moving    8 clients hop together between the three processes every 3 s for 60 s: the total
              used while there is demand (goal ≥ 0.85), and the bytes all processes granted in
              every interval between two samples ≤ total × Δt + bursts (server-side counters);
  * three     three busy processes, 8 clients each: each process's part of the total (goal ≥ 0.3);
  * uneven    64 clients, each its own key, 40 / 16 / 8 over the three processes: fairness per
              client, min/max bytes received (goal ≥ 0.9; static: 8/40 = 0.2);
  * kill      the busy gateway of `busy` is killed (-9) and its clients go to the other two: the
              time until they get ≥ 0.9 of the total (goal: within the lease's 10 s reservation,
              and not before its grant could no longer be used: the killed slot's reservation end,
              read from the database);
  * principal one key with a per-principal total of 8 MiB/s downloads through gateway 1 alone
              (goal ≥ 0.9 of 8 MiB/s; static: 1/3).
Every part also checks the server-side bound over all its samples. Rates are server-side
(`grantedBytes` of /health/ready, sampled every 250 ms, each interval bracketed by the sample
requests' send and answer times) unless the table says "client".

    .venv/bin/python bench/demand_shares.py [--parts busy moving uneven kill principal] [--modes static demand]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import asyncpg
import httpx

from cluster import (
    ADMIN_TOKEN,
    BenchCluster,
    BenchError,
    HttpAnswer,
    MiB,
    bench_main,
    create_repo,
    reader_tokens,
    stream_get,
    table,
    upload,
    verdict,
)

from tests.harness import Cluster  # noqa: E402  (bench/cluster.py put the repository on the path)

TOTAL = 24 * MiB
SLOTS = 3
PER_PRINCIPAL = 8 * MiB
BURSTS = SLOTS * min(TOTAL // SLOTS // 10, MiB)  # static mode's, which demand mode keeps
SAMPLE_S = 0.25
KEYS = reader_tokens(64)
ONE_KEY = next(iter(KEYS))


# -- load and samples ---------------------------------------------------------------------------


class Load:
    """Clients that download `path` over and over from a process each; `move` sends them
    elsewhere (their downloads in flight are cut)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.counters: list[list[int]] = []
        self.tasks: list[asyncio.Task] = []
        self.errors: list[str] = []

    def start(self, urls: list[str], tokens: list[str]) -> None:
        for url, token in zip(urls, tokens, strict=True):
            counter = [0]
            self.counters.append(counter)
            self.tasks.append(asyncio.ensure_future(self._client(url, token, counter)))

    async def _client(self, url: str, token: str, counter: list[int]) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        while True:
            answer = HttpAnswer()
            await stream_get(url, self.path, headers, answer, counter=counter)
            if answer.status != 200 or answer.error:
                self.errors.append(f"{url}: HTTP {answer.status} {answer.error or ''}")
                await asyncio.sleep(0.5)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()


class Samples:
    """Every 250 ms, each process's grantedBytes (and its demand-mode share), with the send and
    answer time of each request."""

    def __init__(self, processes) -> None:
        self.processes = processes
        self.rounds: list[list[tuple[float, float, int, int | None]]] = []
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> Samples:
        self._client = httpx.AsyncClient(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=5)
        self._task = asyncio.ensure_future(self._run())
        while not self.rounds:
            await asyncio.sleep(0.05)
        return self

    async def __aexit__(self, *exc) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._client.aclose()

    async def _run(self) -> None:
        while True:
            round_ = []
            for process in self.processes:
                sent = time.monotonic()
                try:
                    body = (await self._client.get(process.url + "/health/ready")).json()
                except (httpx.HTTPError, ValueError):
                    round_.append((sent, time.monotonic(), -1, None))  # a killed process
                    continue
                answered = time.monotonic()
                granted = body["transfers"]["downloads"]["bandwidth"]["grantedBytes"]
                demand = (body.get("sharedDownloads") or {}).get("demand")
                round_.append((sent, answered, granted, demand["appliedBytesPerSecond"] if demand else None))
            self.rounds.append(round_)
            await asyncio.sleep(SAMPLE_S)

    def mark(self) -> int:
        return len(self.rounds)

    def rate(self, first: int, last: int, which: list[int] | None = None) -> float:
        """Bytes/s granted by the processes `which` (all) between two rounds (known counters only)."""
        a, b = self.rounds[first], self.rounds[last]
        which = range(len(self.processes)) if which is None else which
        granted = sum(b[p][2] - a[p][2] for p in which if a[p][2] >= 0 and b[p][2] >= 0)
        return granted / (b[0][0] - a[0][0]) if b[0][0] > a[0][0] else 0.0

    def worst_excess(self, first: int = 0) -> float:
        """The most the processes together granted over total × Δt + bursts, over every pair of
        rounds from `first` on (a killed process counts with its last known counter)."""
        known = [0] * len(self.processes)
        points = []  # (start of the round, end of the round, Σ granted)
        for round_ in self.rounds[first:]:
            for p, (_, _, granted, _) in enumerate(round_):
                if granted >= 0:
                    known[p] = granted
            points.append((min(s for s, _, _, _ in round_), max(a for _, a, _, _ in round_), sum(known)))
        worst = -float("inf")
        lowest = float("inf")  # min over i of (Σ_i − total × start_i)
        for start, end, total_granted in points:
            if lowest < float("inf"):
                worst = max(worst, total_granted - TOTAL * end - lowest - BURSTS)
            lowest = min(lowest, total_granted - TOTAL * start)
        return worst

    def first_round_at_least(self, first: int, rate: float, which: list[int], window_s: float = 1.0) -> float | None:
        """Seconds from round `first` until `which` together granted ≥ `rate` over a window."""
        rounds = self.rounds
        back = max(1, round(window_s / SAMPLE_S))
        for j in range(first + back, len(rounds)):
            if self.rate(j - back, j, which) >= rate:
                return rounds[j][0][0] - rounds[first][0][0]
        return None


# -- the parts --------------------------------------------------------------------------------


async def part_busy(processes, path: str) -> dict:
    """One download through gateway 1."""
    async with Samples(processes) as samples:
        load = Load(path)
        start = samples.mark()
        load.start([processes[1].url], [ONE_KEY])
        await asyncio.sleep(20)
        end = samples.mark()
        await load.stop()
    reached = samples.first_round_at_least(start, 0.9 * TOTAL, [1])
    later = [samples.rate(j - 4, j, [1]) for j in range(start + 4 * 6, end)]  # 1 s windows from 6 s on
    return {
        "reached": reached, "held": min(later) / TOTAL if later else 0.0,
        "mean": samples.rate(start + 4 * 6, end - 1, [1]) / TOTAL,
        "excess": samples.worst_excess(start), "errors": load.errors,
    }


async def part_moving(processes, path: str, seconds: float = 60.0, hop: float = 3.0) -> dict:
    async with Samples(processes) as samples:
        start = samples.mark()
        errors: list[str] = []
        began = time.monotonic()
        hops = 0
        while time.monotonic() - began < seconds:
            load = Load(path)
            target = processes[hops % len(processes)].url
            load.start([target] * 8, list(KEYS)[:8])
            await asyncio.sleep(hop)
            await load.stop()
            errors += load.errors
            hops += 1
        end = samples.mark()
    return {"used": samples.rate(start + 4, end - 1) / TOTAL, "excess": samples.worst_excess(start),
            "hops": hops, "errors": errors}


async def part_three(processes, path: str) -> dict:
    return await part_uneven(processes, path, split=(8, 8, 8))


async def part_uneven(processes, path: str, seconds: float = 20.0, split: tuple[int, ...] = (40, 16, 8)) -> dict:
    urls = [p.url for p, n in zip(processes, split) for _ in range(n)]
    async with Samples(processes) as samples:
        load = Load(path)
        load.start(urls, list(KEYS)[: len(urls)])
        await asyncio.sleep(5)  # settled
        first, counts_then = samples.mark(), [c[0] for c in load.counters]
        await asyncio.sleep(seconds)
        last, counts_now = samples.mark(), [c[0] for c in load.counters]
        await load.stop()
    per_client = [b - a for a, b in zip(counts_then, counts_now)]
    shares = [samples.rate(first, last - 1, [p]) / TOTAL for p in range(SLOTS)]
    return {"shares": shares, "fairness": min(per_client) / max(per_client) if max(per_client) else 0.0,
            "used": sum(shares), "excess": samples.worst_excess(first), "errors": load.errors}


async def part_kill(processes, path: str, database_url: str) -> dict:
    """Gateway 1 busy with 8 clients, then kill -9; its clients go to the writer and gateway 2."""
    async with Samples(processes) as samples:
        load = Load(path)
        load.start([processes[1].url] * 8, list(KEYS)[:8])
        await asyncio.sleep(8)
        processes[1].proc.kill()
        killed = time.monotonic()
        conn = await asyncpg.connect(database_url)
        try:
            remaining = await conn.fetchval(
                "SELECT extract(epoch FROM expires_at - now())::float8 FROM arkvory_gateway_leases WHERE slot = 1"
            )
        finally:
            await conn.close()
        expires = killed + remaining
        await load.stop()
        errors = [e for e in load.errors if processes[1].url not in e]
        load = Load(path)
        load.start([processes[0].url] * 4 + [processes[2].url] * 4, list(KEYS)[8:16])
        mark = samples.mark()
        await asyncio.sleep(16)
        end = samples.mark()
        await load.stop()
    back = samples.first_round_at_least(mark, 0.9 * TOTAL, [0, 2])
    back_at = None if back is None else samples.rounds[mark][0][0] + back - killed
    # Before the reservation ended, what the two others got at most (1 s windows ending before it):
    before = [samples.rate(j - 4, j, [0, 2]) for j in range(mark + 4, end) if samples.rounds[j][-1][1] < expires]
    return {
        "remaining": remaining, "back": back_at, "before": max(before) / TOTAL if before else None,
        "after": samples.rate(end - 9, end - 1, [0, 2]) / TOTAL,
        "excess": samples.worst_excess(mark), "errors": errors + load.errors,
    }


async def part_principal(processes, path: str) -> dict:
    async with Samples(processes) as samples:
        load = Load(path)
        load.start([processes[1].url] * 2, [ONE_KEY] * 2)  # two downloads of the one key
        await asyncio.sleep(5)
        first = samples.mark()
        await asyncio.sleep(10)
        last = samples.mark()
        await load.stop()
    return {"rate": samples.rate(first, last - 1, [1]) / PER_PRINCIPAL, "excess": samples.worst_excess(first),
            "errors": load.errors}


# -- running --------------------------------------------------------------------------------------


def start_cluster(bench: BenchCluster, mode: str, per_principal: int = 0):
    url = bench.postgres.create_database(f"bench_{uuid.uuid4().hex[:12]}")
    workdir = bench.workdir / f"{mode}-{uuid.uuid4().hex[:6]}"
    workdir.mkdir()
    cluster = Cluster(url, workdir, keys=bench.keys)
    extra = {"ARKVORY_SHARE_MODE": mode, "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL": str(per_principal)}
    shared = cluster.shared_env(slots=SLOTS, total=TOTAL, **extra)
    admission = {"ARKVORY_MAX_DOWNLOADS": "64", "ARKVORY_MAX_DOWNLOADS_PER_PRINCIPAL": "4"}
    writer = cluster.writer(shared, **admission).wait_ready(60)
    gateways = [cluster.gateway(slot, shared, **admission).wait_ready(60) for slot in (1, 2)]
    create_repo(writer, "bench")
    artifact = upload(writer, "bench", "large.bin", 256 * MiB)
    return cluster, url, [writer, *gateways], artifact["path"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parts = ("busy", "moving", "three", "uneven", "kill", "principal")
    parser.add_argument("--parts", nargs="+", choices=parts, default=list(parts))
    parser.add_argument("--modes", nargs="+", choices=("static", "demand"), default=["static", "demand"])
    args = parser.parse_args()
    results: dict[tuple[str, str], dict] = {}
    with BenchCluster(keys=KEYS) as bench:
        for mode in args.modes:
            shared_parts = [p for p in ("busy", "moving", "three", "uneven", "kill") if p in args.parts]
            if shared_parts:
                cluster, url, processes, path = start_cluster(bench, mode)
                try:
                    for part in shared_parts:
                        print(f"{mode}: {part} …", flush=True)
                        if part == "kill":
                            results[mode, part] = asyncio.run(part_kill(processes, path, url))
                        else:
                            runner = {"busy": part_busy, "moving": part_moving, "three": part_three,
                                      "uneven": part_uneven}[part]
                            results[mode, part] = asyncio.run(runner(processes, path))
                            time.sleep(4)  # idle: every share back to its floor (demand mode)
                finally:
                    cluster.close()
            if "principal" in args.parts:
                cluster, url, processes, path = start_cluster(bench, mode, PER_PRINCIPAL)
                try:
                    print(f"{mode}: principal …", flush=True)
                    results[mode, "principal"] = asyncio.run(part_principal(processes, path))
                finally:
                    cluster.close()
    print_results(results, args.modes)
    errors = [e for r in results.values() for e in r["errors"]]
    for line in errors[:10]:
        print("error:", line)
    return 1 if errors else 0


def _s(value: float | None, unit: str = " s") -> str:
    return "never" if value is None else f"{value:.1f}{unit}"


def print_results(results: dict, modes: list[str]) -> None:
    rows = []
    for (mode, part), r in results.items():
        bound = "within" if r["excess"] <= 0 else f"EXCEEDED by {r['excess'] / MiB:.2f} MiB"
        if part == "busy":
            rows.append((mode, "one busy process of three: time to ≥ 0.9 of the total", _s(r["reached"]),
                         "≤ 5 s (static: never, 1/3)", verdict(r["reached"] is not None and r["reached"] <= 5), bound))
            rows.append((mode, "… then its lowest 1 s rate / its mean (of the total)", f"{r['held']:.3f} / {r['mean']:.3f}",
                         "≥ 0.9 (static: 0.333)", verdict(r["held"] >= 0.9), ""))
        elif part == "moving":
            rows.append((mode, f"demand moving ({r['hops']} hops of 3 s): total used", f"{r['used']:.3f}",
                         "≥ 0.85", verdict(r["used"] >= 0.85), bound))
        elif part == "three":
            shares = " / ".join(f"{s:.3f}" for s in r["shares"])
            rows.append((mode, "three busy processes (8 clients each): each one's part of the total", shares,
                         "≥ 0.3 each", verdict(min(r["shares"]) >= 0.3), bound))
        elif part == "uneven":
            shares = " / ".join(f"{s:.3f}" for s in r["shares"])
            rows.append((mode, f"64 clients 40/16/8: fairness per client (client bytes, min/max); parts {shares}",
                         f"{r['fairness']:.3f}", "≥ 0.9 (static: 0.2)", verdict(r["fairness"] >= 0.9), bound))
        elif part == "kill":
            ok = r["back"] is not None and r["back"] <= 10.5 and r["back"] >= r["remaining"] - 0.5
            rows.append((mode, "kill -9 of the busiest: the others get ≥ 0.9 of the total after",
                         f"{_s(r['back'])} (its reservation: {r['remaining']:.1f} s)",
                         "≤ 10 s, not before its reservation ends", verdict(ok), bound))
            before = "-" if r["before"] is None else f"{r['before']:.3f}"
            rows.append((mode, "… the others' part before its reservation ended / at the end", f"{before} / {r['after']:.3f}",
                         "-", "-", ""))
        elif part == "principal":
            rows.append((mode, "one key (8 MiB/s total) through one process of three", f"{r['rate']:.3f} of 8 MiB/s",
                         "≥ 0.9 (static: 0.333)", verdict(r["rate"] >= 0.9), bound))
    rows.sort(key=lambda row: modes.index(row[0]))
    print()
    print(table(rows, ("mode", "figure", "value", "goal", "result", "Σ granted ≤ total × Δt + bursts")))
    print(f"\n(writer + 2 gateways, total {TOTAL // MiB} MiB/s, bursts {BURSTS / MiB:.1f} MiB; rates server-side unless named)")


if __name__ == "__main__":
    bench_main("demand_shares", 1200, main)
