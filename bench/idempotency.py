"""Replays of a small change by Idempotency-Key on one writer, with wrk.

Goal (issue 7, performance): a replay of a small change ≥ 2,000 per second on one writer (it is
one indexed lookup of (principal, key) after authentication and the body check).

Two changes are replayed, each first made once with its key, then sent again by wrk with the same
key and body for `--seconds`: creating a repository (`POST /api/v1/repositories`) and re-pointing
an asset (`PUT /api/v1/repositories/{repo}/assets?path=`). Before and after, the bench checks
that the answer is a replay (`Idempotent-Replayed: true`) and that no second change happened.
`GET /health/live` on the same writer is the reference: what a request without a database costs.

    .venv/bin/python bench/idempotency.py [--seconds 10] [--connections 32] [--threads 2]
"""

from __future__ import annotations

import argparse
import json

from cluster import (
    ADMIN_TOKEN,
    BenchCluster,
    BenchError,
    admin,
    bench_main,
    create_repo,
    run_wrk,
    table,
    upload,
    verdict,
)

GOAL_RPS = 2000


def lua_request(method: str, body: dict, key: str) -> str:
    payload = json.dumps(body).replace("\\", "\\\\").replace('"', '\\"')
    return (
        f'wrk.method = "{method}"\n'
        f'wrk.body = "{payload}"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Idempotency-Key"] = "{key}"\n'
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pool-size", type=int, default=10, help="ARKVORY_DATABASE_POOL_SIZE")
    args = parser.parse_args()
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    rows = []
    ok = True
    with BenchCluster() as bench:
        writer = bench.writer(ARKVORY_DATABASE_POOL_SIZE=str(args.pool_size))
        create_repo(writer, "bench")
        artifact = upload(writer, "bench", "small.bin", 1024)
        cases = [
            ("create repository", "POST", "/api/v1/repositories", {"name": "replayed"}, "bench-replay-1"),
            ("re-point asset", "PUT", "/api/v1/repositories/bench/assets?path=latest", {"artifactId": artifact["id"]}, "bench-replay-2"),
        ]
        with admin(writer) as client:
            for name, method, path, body, key in cases:
                first = client.request(method, path, json=body, headers={"Idempotency-Key": key})
                if first.status_code >= 300:
                    raise BenchError(f"{name}: {first.status_code} {first.text}")
        common = dict(threads=args.threads, connections=args.connections, headers=auth, workdir=bench.workdir)
        live = run_wrk(writer.url + "/health/live", seconds=args.seconds, **common)
        rows.append(("GET /health/live (reference)", f"{live['rps']:.0f}", live["non2xx"], f"{live['latency_mean_s'] * 1e3:.2f}", ""))
        for name, method, path, body, key in cases:
            script = lua_request(method, body, key)
            run_wrk(writer.url + path, seconds=2, script=script, **common)  # warm-up
            result = run_wrk(writer.url + path, seconds=args.seconds, script=script, **common)
            met = result["rps"] >= GOAL_RPS and result["non2xx"] == 0 and result["socket_errors"] == 0
            ok = ok and met
            rows.append((f"replay: {name}", f"{result['rps']:.0f}", result["non2xx"], f"{result['latency_mean_s'] * 1e3:.2f}", verdict(met)))
        with admin(writer) as client:
            for name, method, path, body, key in cases:
                again = client.request(method, path, json=body, headers={"Idempotency-Key": key})
                if again.headers.get("idempotent-replayed") != "true":
                    raise BenchError(f"{name}: the answer was not a replay: {again.status_code} {again.text}")
            repos = client.get("/api/v1/repositories").json()["items"]
            history = client.get("/api/v1/repositories/bench/asset", params={"path": "latest"}).json()["history"]
        if [r["name"] for r in repos] != ["bench", "replayed"] or len(history) != 1:
            raise BenchError("a replay changed something: repositories or asset history grew")
    print(f"{args.threads} wrk threads, {args.connections} connections, {args.seconds} s each; goal ≥ {GOAL_RPS} replays/s")
    print(table(rows, ("request", "req/s", "non-2xx", "mean latency ms", "goal")))
    return 0 if ok else 1


if __name__ == "__main__":
    bench_main("idempotency", 300, main)
