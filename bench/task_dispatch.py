"""Dispatch → `task.running` latency with an idle worker (LISTEN/NOTIFY, not polling).

Goal (issue 8, performance): under 1 s. A writer and a worker (real `arkvory serve` and
`arkvory worker` processes, one PostgreSQL with fsync off); `--tasks` verify tasks are
dispatched one at a time with `POST /api/v1/tasks`, each after the previous one completed, so
the worker is idle every time. Two measures per task:

- client: from the 202 arriving to this script hearing the `task.running` event (it LISTENs on
  `arkvory_tasks` itself, as the worker does);
- database: from the `task.queued` event's `created_at` (committed before the 202) to the
  `task.running` event's, both on the database's clock.

The worker's safety-net poll runs every 10 s, so figures well under that come from the
notification. `--pause` idles the worker between tasks (longer than a poll period shows the
poll is not what wakes it).

    .venv/bin/python bench/task_dispatch.py [--tasks 50] [--pause 0.2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import asyncpg
import httpx

from cluster import ADMIN_TOKEN, BenchCluster, BenchError, bench_main, table, verdict

from tests.harness import free_port  # noqa: E402  (cluster.py put the repository on sys.path)
from tests.worker_harness import WorkerProc  # noqa: E402

GOAL_S = 1.0
WAIT_S = 30.0


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(writer_url: str, database_url: str, tasks: int, pause: float) -> tuple[list[float], list[float]]:
    heard: dict[tuple[str, str], float] = {}
    news = asyncio.Event()

    def on_event(conn, pid, channel, payload):
        task_id, _, kind = payload.split(" ")
        heard[(task_id, kind)] = time.perf_counter()
        news.set()

    async def until(key: tuple[str, str]) -> float:
        deadline = time.monotonic() + WAIT_S
        while key not in heard:
            news.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"no {key[1]} for task {key[0]} after {WAIT_S} s")
            try:
                await asyncio.wait_for(news.wait(), left)
            except TimeoutError:
                pass
        return heard[key]

    listener = await asyncpg.connect(database_url)
    await listener.add_listener("arkvory_tasks", on_event)
    client_latencies, database_latencies = [], []
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    try:
        async with httpx.AsyncClient(base_url=writer_url, headers=headers, timeout=10) as client:
            for n in range(tasks):
                if pause:
                    await asyncio.sleep(pause)
                answer = await client.post(
                    "/api/v1/tasks", json={"kind": "verify", "on_restart": "resume"},
                    headers={"Idempotency-Key": f"bench-{uuid.uuid4().hex}"},
                )
                accepted = time.perf_counter()
                if answer.status_code != 202:
                    raise BenchError(f"dispatch {n}: {answer.status_code} {answer.text}")
                task_id = answer.json()["id"]
                running = await until((task_id, "task.running"))
                client_latencies.append(running - accepted)
                await until((task_id, "task.completed"))
                created = await listener.fetch(
                    "SELECT type, created_at FROM arkvory_task_events WHERE task_id = $1"
                    " AND type IN ('task.queued', 'task.running') ORDER BY seq",
                    uuid.UUID(task_id),
                )
                database_latencies.append((created[1]["created_at"] - created[0]["created_at"]).total_seconds())
    finally:
        await listener.close()
    return client_latencies, database_latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--pause", type=float, default=0.2, help="seconds the worker idles between tasks")
    args = parser.parse_args()
    with BenchCluster() as bench:
        writer = bench.writer(ARKVORY_CLEANUP_INTERVAL="off")
        env = bench.cluster.base_env(ARKVORY_WORKER_PORT=str(free_port()))
        worker = WorkerProc("worker", env, bench.workdir, real=True)
        bench.cluster.processes.append(worker)  # type: ignore[arg-type]  (stopped with the cluster)
        worker.wait_active(60)
        client, database = asyncio.run(measure(writer.url, bench.database_url, args.tasks, args.pause))
    rows = []
    ok = True
    for name, values in (("202 → task.running heard (client clock)", client), ("task.queued → task.running (database clock)", database)):
        met = max(values) < GOAL_S
        ok = ok and met
        rows.append((name, len(values), f"{statistics.median(values) * 1e3:.1f}", f"{quantile(values, 0.95) * 1e3:.1f}", f"{max(values) * 1e3:.1f}", verdict(met)))
    print(f"{args.tasks} verify tasks dispatched one at a time, {args.pause} s idle between; goal: every one < {GOAL_S:.0f} s")
    print(table(rows, ("latency", "tasks", "median ms", "p95 ms", "max ms", "goal")))
    return 0 if ok else 1


if __name__ == "__main__":
    bench_main("task_dispatch", 300, main)
