"""Blobs on a local SeaweedFS (issue 16): the read cache and the store, side by side with the
tools an operator would compare them with, in one run, printed with the CPU model.

    .venv/bin/python bench/s3_cache.py [--size-mib 1024] [--runs 3] [--clients 1000]
                                       [--parts cold hot upload many]

To compare two versions of the code, run it with `PYTHONPATH=DIR` (DIR/arkvory a checkout of
the other version: every Arkvory process then runs that code), alternating with the tree's own;
or, on a host shared with other work, with `--reference DIR`: part 1 then also reads through a
second pair of gateways running DIR's code, in the same rounds (curl, then the four gateways in
an order that alternates), so both trees meet the same load.

1. cold read   a 1 GiB artifact through a gateway with a cold read cache (the fill: one GET of
               the store, readers behind it) and through a gateway without a cache (streamed
               from the store), vs `curl --aws-sigv4` of the same object straight from SeaweedFS.
               Goal: gateway ≥ 0.8 × curl. Each gateway run starts from an empty cache.
2. hot read    the same artifact again from the cache (sendfile of the cached file) vs nginx
               (sendfile) serving that very file. Goal: ≥ 0.8 × nginx, server CPU per GiB ≤ 2 ×.
3. upload      a 1 GiB resumable upload (parts of 64 MiB, then `complete`, which publishes to the
               store) vs obstore's own multipart upload (16 MiB parts, 4 at a time: what the
               backend uses) of the same file, alternating, `--runs` rounds, each of a file
               with other bytes (a new blob for the store each time). Goal: ≥ 0.7 ×.
               `complete` alone is shown beside.
4. many        1,000 concurrent throttled downloads of a 1 MiB artifact from the store (no cache)
               on one gateway: its peak RSS, errors. Goal: RSS < 200 MiB, 0 errors.

Everything is unthrottled (the largest total the settings accept) except part 4. On 2 cores
SeaweedFS, the gateway and curl share the CPUs: figures from such a host are lower bounds.
No credential reaches a command line: curl reads them from a 0600 config file.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import functools
import os
import pathlib
import resource
import statistics
import subprocess
import time
import uuid

import obstore
from obstore.store import S3Store

from cluster import (
    ADMIN_TOKEN,
    MAX_RATE,
    BenchCluster,
    BenchError,
    GiB,
    MiB,
    Nginx,
    admin,
    bench_main,
    cpu_seconds,
    create_repo,
    machine,
    memory_kib,
    metrics,
    need_tool,
    reader_tokens,
    sha256_of,
    table,
    tree_cpu_seconds,
    upload,
    verdict,
    warm_page_cache,
)
from many_downloads import raise_fd_limit
from many_downloads import run as many_downloads
from upload import make_file, part_hashes

from arkvory.shared.cli.seaweedfs import start_seaweedfs
from arkvory.shared.client.transport import framed_body

BUCKET, PREFIX = "bench", "inst"
UPLOAD_PART = 64 * MiB


def curl(argv: list[str], size: int, timeout: float = 600) -> float:
    """Seconds of one curl download of `size` bytes to /dev/null (its CPU seconds: `curl_cpu`)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [need_tool("curl"), "-sS", "-o", "/dev/null", "-w", "%{http_code} %{size_download} %{time_total}", *argv],
        capture_output=True, text=True, timeout=timeout,
    )
    if out.returncode != 0:
        raise BenchError(f"curl failed ({out.returncode}): {out.stderr.strip()}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    curl_cpu[0] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    code, got, seconds = out.stdout.split()
    if code not in ("200", "206") or int(got) != size:
        raise BenchError(f"curl: HTTP {code}, {got} of {size} bytes")
    return float(seconds)


curl_cpu = [0.0]  # CPU seconds of the last curl


def curl_rate(config: pathlib.Path, url: str, size: int) -> tuple[float, float]:
    """(MiB/s, 0.0) of curl reading `url` straight from the store: no gateway, no gateway CPU."""
    return size / curl(["-K", str(config), url], size) / MiB, 0.0


FILLS = 'arkvory_read_cache_fills_total{result="ok"}'
download_cpu = [0.0]  # the gateway's CPU s/GiB of the last download until its last byte (a fill's hash may trail)


def gateway_get(process, path: str, size: int, *, fills: bool = False) -> tuple[float, float]:
    """(MiB/s, server CPU s/GiB) of one download through `process`. With `fills` (a cold read
    through a read cache), the CPU counts until the fill ends: its hash may trail the download."""
    before = cpu_seconds(process.proc.pid)
    filled = metrics(process).get(FILLS, 0.0) if fills else 0.0
    seconds = curl(["-H", f"Authorization: Bearer {ADMIN_TOKEN}", process.url + path], size)
    download_cpu[0] = (cpu_seconds(process.proc.pid) - before) / (size / GiB)
    deadline = time.monotonic() + 60
    while fills and metrics(process).get(FILLS, 0.0) <= filled and time.monotonic() < deadline:
        time.sleep(0.05)
    return size / seconds / MiB, (cpu_seconds(process.proc.pid) - before) / (size / GiB)


async def obstore_put(store_env: dict[str, str], path: pathlib.Path, key: str) -> float:
    store = S3Store(
        BUCKET, endpoint=store_env["ARKVORY_S3_ENDPOINT_URL"], region=store_env["ARKVORY_S3_REGION"],
        access_key_id=store_env["AWS_ACCESS_KEY_ID"], secret_access_key=store_env["AWS_SECRET_ACCESS_KEY"],
        virtual_hosted_style_request=False, unsigned_payload=True,
        client_options={"allow_http": True, "timeout": datetime.timedelta(seconds=600)},
    )
    started = time.perf_counter()
    await obstore.put_async(store, key, path, use_multipart=True, chunk_size=16 * MiB, max_concurrency=4)
    return time.perf_counter() - started


def timed_resumable_upload(writer, path: pathlib.Path, size: int, part: int, hashes: list[str],
                           whole: str) -> tuple[float, float]:
    """(whole seconds, seconds of `complete` alone) of one resumable upload: the session with
    its declared SHA-256, the parts one after another, then complete (bench/upload.py's shape)."""
    started = time.perf_counter()
    base = "/api/v1/repositories/bench/uploads"
    with admin(writer) as client:
        answer = client.post(base, json={"name": f"up-{whole[:12]}.bin", "size": size, "sha256": whole,
                                         "partSize": part}, headers={"Idempotency-Key": uuid.uuid4().hex})
        if answer.status_code != 201:
            raise BenchError(f"create: {answer.status_code} {answer.text}")
        session = answer.json()
        with open(path, "rb") as file:
            for index, digest in enumerate(hashes):
                file.seek(index * part)
                # In slices, as the client library sends it (httpcore's copy: transport.py).
                body, headers = framed_body(file.read(part), {"X-Content-SHA256": digest})
                answer = client.put(f"{base}/{session['id']}/parts/{index}", content=body, headers=headers)
                if answer.status_code != 200:
                    raise BenchError(f"part {index}: {answer.status_code} {answer.text}")
        completing = time.perf_counter()
        answer = client.post(f"{base}/{session['id']}/complete")
    if answer.status_code != 201 or answer.json()["sha256"] != whole:
        raise BenchError(f"complete: {answer.status_code} {answer.text}")
    ended = time.perf_counter()
    return ended - started, ended - completing


def median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--share-mib", type=float, default=32.0, help="part 4: the gateway's share, MiB/s")
    parser.add_argument("--reference", type=pathlib.Path, metavar="DIR",
                        help="part 1: also read through gateways running DIR/arkvory (another checkout)")
    parser.add_argument("--parts", nargs="+", choices=("cold", "hot", "upload", "many"),
                        default=["cold", "hot", "upload", "many"], help="which measurements (hot needs cold)")
    args = parser.parse_args()
    if "hot" in args.parts and "cold" not in args.parts:
        parser.error("--parts: hot reads the file the cold reads cached; add cold")
    size = args.size_mib * MiB
    raise_fd_limit(args.clients * 2 + 512)
    keys = reader_tokens(args.clients)
    print(machine(), flush=True)

    with BenchCluster(keys=keys) as bench:
        weed = start_seaweedfs(bench.workdir / "seaweedfs")
        try:
            weed.create_bucket(BUCKET)
            store_env = weed.environ(BUCKET, PREFIX)
            curl_config = bench.workdir / "curl.conf"
            curl_config.touch(mode=0o600)
            curl_config.write_text(
                f'user = "{store_env["AWS_ACCESS_KEY_ID"]}:{store_env["AWS_SECRET_ACCESS_KEY"]}"\n'
                f'aws-sigv4 = "aws:amz:{store_env["ARKVORY_S3_REGION"]}:s3"\n'
            )
            shared = bench.shared(slots=6, total=MAX_RATE)
            writer = bench.writer(shared, **store_env)
            create_repo(writer, "bench")

            # 3. upload: the resumable API (parts to local disk, complete publishes) vs obstore,
            # alternating; each round's file differs in its first bytes (a new blob each time).
            uploads: dict[str, list[float]] = {"obstore": [], "ours": [], "complete": []}
            if "upload" in args.parts:
                source = bench.workdir / "upload.bin"
                make_file(source, size)
                for run in range(args.runs):
                    with open(source, "r+b") as file:
                        file.write(f"round {run} of {time.time()}".encode().ljust(64))
                    hashes = part_hashes(source, size, UPLOAD_PART)
                    whole = sha256_of(source)
                    warm_page_cache(source)
                    reference_store_cpu = tree_cpu_seconds([weed.pid])
                    uploads["obstore"].append(asyncio.run(obstore_put(store_env, source, f"{PREFIX}/reference/{whole}")))
                    reference_store_cpu = tree_cpu_seconds([weed.pid]) - reference_store_cpu
                    writer_cpu, store_cpu = cpu_seconds(writer.proc.pid), tree_cpu_seconds([weed.pid])
                    client_cpu = sum(os.times()[:2])
                    ours_s, complete_s = timed_resumable_upload(writer, source, size, UPLOAD_PART, hashes, whole)
                    client_cpu = sum(os.times()[:2]) - client_cpu
                    writer_cpu = cpu_seconds(writer.proc.pid) - writer_cpu
                    store_cpu = tree_cpu_seconds([weed.pid]) - store_cpu
                    uploads["ours"].append(ours_s)
                    uploads["complete"].append(complete_s)
                    print(f"upload round {run}: obstore {uploads['obstore'][-1]:.1f} s, ours {ours_s:.1f} s"
                          f" (complete {complete_s:.1f} s; CPU s: writer {writer_cpu:.1f}, store {store_cpu:.1f},"
                          f" client {client_cpu:.1f}; the store took {reference_store_cpu:.1f} for obstore's)",
                          flush=True)
                source.unlink()

            cold: dict[str, list[float]] = {name: [] for name in COLD_READS}
            hot: dict[str, list[tuple[float, float]]] = {"cache": [], "nginx": []}
            if "cold" in args.parts:
                measure_reads(bench, args, shared, store_env, writer, curl_config, size, cold, hot, weed.pid)
            peak = idle = elapsed = 0.0
            errors: list = []
            unfinished = 0
            if "many" in args.parts:
                peak, idle, elapsed, errors, unfinished = measure_many(bench, args, shared, store_env, writer, keys)
        finally:
            weed.destroy()
        return report(args, size, cold, hot, uploads, peak, idle, elapsed, errors, unfinished)


COLD_READS = ("curl", "stream", "cache", "reference stream", "reference cache")
cold_cpu: dict[str, list[list[float]]] = {name: [] for name in COLD_READS}  # per round: gateway, store, curl
during: dict[str, list[float]] = {name: [] for name in COLD_READS}  # the gateway's CPU s/GiB until the last byte


def measure_reads(bench, args, shared, store_env, writer, curl_config, size, cold, hot, weed_pid) -> None:
    """Parts 1 and 2: cold reads alternating with curl, then hot reads alternating with nginx."""
    # One artifact per run: each is cold in the cache when its run reads it.
    artifacts = [upload(writer, "bench", f"big{run}.bin", size) for run in range(args.runs)]

    def object_url(artifact: dict) -> str:
        digest = artifact["sha256"]
        return (f"{store_env['ARKVORY_S3_ENDPOINT_URL']}/{BUCKET}/{PREFIX}/blobs/sha256/"
                f"{digest[:2]}/{digest[2:4]}/{digest}")

    cached = bench.gateway(1, shared, ARKVORY_CACHE_MAX_BYTES=str(args.runs * size + GiB),
                           ARKVORY_DATA_DIR=str(bench.workdir / "gw1"), **store_env)
    streaming = bench.gateway(2, shared, ARKVORY_DATA_DIR=str(bench.workdir / "gw2"), **store_env)
    gateways = {"stream": streaming, "cache": cached}
    if args.reference is not None:  # the other tree's code in these two (PYTHONPATH wins over the venv)
        other = {"PYTHONPATH": str(args.reference.resolve())}
        gateways["reference stream"] = bench.gateway(
            4, shared, ARKVORY_DATA_DIR=str(bench.workdir / "gw4"), **store_env, **other)
        gateways["reference cache"] = bench.gateway(
            5, shared, ARKVORY_CACHE_MAX_BYTES=str(args.runs * size + GiB),
            ARKVORY_DATA_DIR=str(bench.workdir / "gw5"), **store_env, **other)
    warm = upload(writer, "bench", "warm.bin", 64 * MiB)
    curl(["-K", str(curl_config), object_url(warm)], 64 * MiB)  # connections, lazy set-up
    for process in gateways.values():
        gateway_get(process, warm["path"], 64 * MiB)

    # 1. cold reads, alternating; the CPU seconds per GiB of the gateway, SeaweedFS and curl.
    gib = size / GiB

    def timed(read):
        store = tree_cpu_seconds([weed_pid])
        rate, gateway_cpu = read()
        return rate, gateway_cpu, (tree_cpu_seconds([weed_pid]) - store) / gib, curl_cpu[0] / gib

    for index, artifact in enumerate(artifacts):
        order = list(gateways) if index % 2 == 0 else list(reversed(gateways))
        for name in ["curl", *order]:
            if name == "curl":
                read = functools.partial(curl_rate, curl_config, object_url(artifact), size)
            else:
                read = functools.partial(gateway_get, gateways[name], artifact["path"], size, fills="cache" in name)
            rate, *cpu = timed(read)
            cold[name].append(rate)
            cold_cpu[name].append(cpu)
            during[name].append(download_cpu[0] if name != "curl" else 0.0)
        print(f"cold round {len(cold['curl'])}: " + "; ".join(
            f"{name} {cold[name][-1]:.0f} MiB/s (CPU s/GiB: gateway {g:.2f}"
            + (f" [{during[name][-1]:.2f} until the last byte]" if "cache" in name else "")
            + f", store {w:.2f}, curl {c:.2f})"
            for name in ["curl", *gateways] for g, w, c in [cold_cpu[name][-1]]
        ) + f"; load {os.getloadavg()[0]:.2f}", flush=True)
    artifact, path = artifacts[-1], artifacts[-1]["path"]

    # 2. hot reads: the cached file, through the gateway and through nginx.
    cache_dir = pathlib.Path(cached.env["ARKVORY_DATA_DIR"]) / "cache"
    cached_file = cache_dir / "blobs" / artifact["sha256"][:2] / artifact["sha256"]
    if "hot" not in args.parts:
        cached.close()
        streaming.close()
        return
    warm_page_cache(cached_file)
    nginx = Nginx(cache_dir, bench.workdir)
    try:
        nginx_url = f"{nginx.url}/{cached_file.relative_to(cache_dir)}"
        curl([nginx_url], size)
        gateway_get(cached, path, size)  # the file's first read in the process checks it from the disk
        for _ in range(args.runs):
            hot["cache"].append(gateway_get(cached, path, size))
            before = tree_cpu_seconds(nginx.pids())
            seconds = curl([nginx_url], size)
            hot["nginx"].append((size / seconds / MiB, (tree_cpu_seconds(nginx.pids()) - before) / (size / GiB)))
    finally:
        nginx.close()
    for process in gateways.values():
        process.close()


def measure_many(bench, args, shared, store_env, writer, keys):
    """Part 4: many throttled downloads from the store, no cache, on one gateway."""
    small = upload(writer, "bench", "one.bin", MiB)
    share = int(args.share_mib * MiB)
    many_shared = dict(shared)
    many = bench.gateway(3, many_shared, ARKVORY_DATA_DIR=str(bench.workdir / "gw3"),
                         ARKVORY_DOWNLOAD_BYTES_PER_SECOND=str(share), ARKVORY_MAX_DOWNLOADS="256",
                         ARKVORY_DOWNLOAD_QUEUE_SIZE="1024", ARKVORY_DOWNLOAD_QUEUE_TIMEOUT_MS="120000",
                         **store_env)
    idle = memory_kib(many.proc.pid)["VmRSS"]
    limit_s = args.clients * MiB / share * 1.5 + 30
    answers, rss, _admission, elapsed, _sent, unfinished = asyncio.run(
        many_downloads(many, small["path"], list(keys), MiB, limit_s)
    )
    peak = max([memory_kib(many.proc.pid)["VmHWM"], *(r for _, r in rss)])
    errors = [a for a in answers if a.status != 200 or a.error or a.received != MiB]
    return peak, idle, elapsed, errors, unfinished


def report(args, size, cold, hot, uploads, peak, idle, elapsed, errors, unfinished) -> int:
    print()
    rows, verdicts = [], []
    if cold["curl"]:
        c_curl, c_cache, c_stream = (median(cold[k]) for k in ("curl", "cache", "stream"))
        # The median of the ratios within each round: on a shared host curl's own rate swings
        # from round to round, and a ratio of medians would mix rounds.
        r_cache, r_stream = (median([a / b for a, b in zip(cold[k], cold["curl"])]) for k in ("cache", "stream"))
        rows += [
            ("cold: curl --aws-sigv4 straight from SeaweedFS", f"{c_curl:.0f} MiB/s", ""),
            ("cold: gateway, read cache filling", f"{c_cache:.0f} MiB/s", f"{r_cache:.2f} × curl"),
            ("cold: gateway, no cache (streamed)", f"{c_stream:.0f} MiB/s", f"{r_stream:.2f} × curl"),
        ]
        verdicts += [
            ("cold read (cache filling) / curl", f"{r_cache:.2f}", "≥ 0.80", verdict(r_cache >= 0.8)),
            ("cold read (no cache) / curl", f"{r_stream:.2f}", "≥ 0.80", verdict(r_stream >= 0.8)),
        ]
        print("cold rounds (MiB/s): " + "; ".join(
            f"curl {a:.0f} cache {b:.0f} stream {c:.0f}" for a, b, c in zip(cold["curl"], cold["cache"], cold["stream"])))
        print(f"cold curl: CPU s/GiB medians store {median([w for _, w, _ in cold_cpu['curl']]):.2f},"
              f" curl {median([c for _, _, c in cold_cpu['curl']]):.2f}")
        for name in (name for name in COLD_READS[1:] if cold[name]):
            if "cache" in name:
                print(f"cold {name}: gateway CPU s/GiB until the last byte, median {median(during[name]):.2f}")
            ratios = [r / c for r, c in zip(cold[name], cold["curl"])]
            print(f"cold {name} / curl per round: " + ", ".join(f"{r:.2f}" for r in ratios)
                  + f" (median {median(ratios):.2f}, range {min(ratios):.2f}-{max(ratios):.2f});"
                  f" gateway CPU s/GiB median {median([g for g, _, _ in cold_cpu[name]]):.2f}"
                  f" ({min(g for g, _, _ in cold_cpu[name]):.2f}-{max(g for g, _, _ in cold_cpu[name]):.2f});"
                  f" store {median([w for _, w, _ in cold_cpu[name]]):.2f}, curl {median([c for _, _, c in cold_cpu[name]]):.2f}")
        for name in ("stream", "cache"):
            if cold[f"reference {name}"]:
                ratios = [a / b for a, b in zip(cold[name], cold[f"reference {name}"])]
                print(f"cold {name}: this tree / reference per round: " + ", ".join(f"{r:.2f}" for r in ratios)
                      + f" (median {median(ratios):.2f})")
    if hot["cache"]:
        h_rate, h_cpu = median([r for r, _ in hot["cache"]]), median([c for _, c in hot["cache"]])
        n_rate, n_cpu = median([r for r, _ in hot["nginx"]]), median([c for _, c in hot["nginx"]])
        rows += [
            ("hot: nginx sendfile of the cached file", f"{n_rate:.0f} MiB/s, {n_cpu:.3f} CPU s/GiB", ""),
            ("hot: gateway, cache hit (sendfile)", f"{h_rate:.0f} MiB/s, {h_cpu:.3f} CPU s/GiB",
             f"{h_rate / n_rate:.2f} × nginx, CPU {h_cpu / max(n_cpu, 1e-9):.2f} ×"),
        ]
        verdicts += [
            ("hot read / nginx", f"{h_rate / n_rate:.2f}", "≥ 0.80", verdict(h_rate / n_rate >= 0.8)),
            ("hot CPU per GiB / nginx", f"{h_cpu / max(n_cpu, 1e-9):.2f}", "≤ 2.00", verdict(h_cpu <= 2 * n_cpu)),
        ]
    if uploads["ours"]:
        library_s, ours_s, complete_s = (median(uploads[k]) for k in ("obstore", "ours", "complete"))
        rows += [
            ("upload: obstore multipart put", f"{size / library_s / MiB:.0f} MiB/s ({library_s:.1f} s)", ""),
            ("upload: resumable API, parts + complete", f"{size / ours_s / MiB:.0f} MiB/s ({ours_s:.1f} s,"
             f" complete {complete_s:.1f} s)", f"{library_s / ours_s:.2f} × obstore"),
        ]
        verdicts.append(
            ("upload / obstore multipart", f"{library_s / ours_s:.2f}", "≥ 0.70", verdict(library_s / ours_s >= 0.7)))
    if "many" in args.parts:
        rows.append((f"many: {args.clients} throttled downloads from the store", f"peak RSS {peak / 1024:.0f} MiB"
                     f" (idle {idle / 1024:.0f}), {len(errors)} errors, {elapsed:.1f} s", ""))
        verdicts += [
            ("1,000 throttled: peak RSS", f"{peak / 1024:.0f} MiB", "< 200 MiB", verdict(peak < 200 * 1024)),
            ("1,000 throttled: errors", str(len(errors) + unfinished), "0", verdict(not errors and not unfinished)),
        ]
    print(table(rows, ("figure", "value", "ratio")))
    print()
    print(table(verdicts, ("figure", "measured", "goal", "result")))
    print(f"\n({args.runs} runs of {size // MiB} MiB each, medians; client: curl -o /dev/null; {machine()};"
          f" load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
    return 0 if not errors else 1


if __name__ == "__main__":
    bench_main("s3_cache", 1800, main)
