"""One 1 GiB upload through the resumable API vs `sha256sum` + `cp` of the same file, with the
writer serving throttled downloads at the same time.

Goals (issue 7): upload ≥ 0.7 × the speed of `sha256sum FILE && cp FILE COPY` on the same host,
and the writer's concurrent downloads keep their rate (≥ 0.9 × their rate without the upload:
the upload must not starve the event loop).

The upload: a session with parts of --part-mib MiB (8-64), sent one at a time (a principal's
share of the writer's upload places with default settings, ARKVORY_MAX_UPLOADS_PER_PRINCIPAL;
each part read from the file and sent with its X-Content-SHA256), then `complete`. The
part hashes are computed before the clock starts, as the reference's work is only the server
side's: hash + copy. The downloads: one curl at a time, in a loop, of a 64 MiB artifact from the
writer, throttled by the writer to --download-mib-s (ARKVORY_DOWNLOAD_BYTES_PER_SECOND); their
rate is measured alone first, then during the upload. Everything runs on one host (2 cores
shared by the client, the writer, PostgreSQL and the downloads).

    .venv/bin/python bench/upload.py [--size-mib 1024] [--part-mib 32] [--runs 2]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import os
import statistics
import subprocess
import threading
import time
import uuid

from cluster import (
    ADMIN_TOKEN,
    BenchCluster,
    BenchError,
    MiB,
    admin,
    bench_main,
    create_repo,
    need_tool,
    table,
    upload,
    verdict,
)

from arkvory.shared.client.transport import framed_body  # noqa: E402  (cluster sets the path)


SENDERS = 1  # parts in flight: one principal's upload places on a writer with default settings


def make_file(path, size: int) -> None:
    block = os.urandom(4 * MiB)
    with open(path, "wb") as file:
        written = index = 0
        while written < size:
            piece = (index.to_bytes(8, "big") + block[8:])[: size - written]
            file.write(piece)
            written += len(piece)
            index += 1


def reference_seconds(path, copy_path) -> tuple[float, float]:
    """`sha256sum FILE && cp FILE COPY`, the page cache warm: (seconds with the copy synced to
    disk, as the upload's bytes are; seconds without, the copy left in the page cache)."""
    subprocess.run([need_tool("sync")], check=True)
    started = time.perf_counter()
    subprocess.run([need_tool("sha256sum"), str(path)], check=True, capture_output=True)
    subprocess.run([need_tool("cp"), str(path), str(copy_path)], check=True)
    unsynced = time.perf_counter() - started
    subprocess.run([need_tool("sync"), str(copy_path)], check=True)
    synced = time.perf_counter() - started
    os.unlink(copy_path)
    return synced, unsynced


def part_hashes(path, size: int, part: int) -> list[str]:
    hashes = []
    with open(path, "rb") as file:
        while chunk := file.read(part):
            hashes.append(hashlib.sha256(chunk).hexdigest())
    return hashes


def resumable_upload(writer, path, size: int, part: int, hashes: list[str], whole: str) -> float:
    started = time.perf_counter()
    base = "/api/v1/repositories/bench/uploads"
    with admin(writer) as client:
        answer = client.post(base, json={"name": "big.bin", "size": size, "sha256": whole, "partSize": part},
                             headers={"Idempotency-Key": uuid.uuid4().hex})
        if answer.status_code != 201:
            raise BenchError(f"create: {answer.status_code} {answer.text}")
        session = answer.json()
    indexes = list(range(len(hashes)))
    lock = threading.Lock()

    def sender() -> None:
        with admin(writer) as client, open(path, "rb") as file:
            while True:
                with lock:
                    if not indexes:
                        return
                    index = indexes.pop(0)
                file.seek(index * part)
                # In slices, as the client library sends it (httpcore's copy: transport.py).
                body, headers = framed_body(file.read(part), {"X-Content-SHA256": hashes[index]})
                answer = client.put(f"{base}/{session['id']}/parts/{index}", content=body, headers=headers)
                if answer.status_code != 200:
                    raise BenchError(f"part {index}: {answer.status_code} {answer.text}")

    with concurrent.futures.ThreadPoolExecutor(SENDERS) as pool:
        for future in [pool.submit(sender) for _ in range(SENDERS)]:
            future.result()
    with admin(writer) as client:
        answer = client.post(f"{base}/{session['id']}/complete")
    if answer.status_code != 201 or answer.json()["sha256"] != whole:
        raise BenchError(f"complete: {answer.status_code} {answer.text}")
    return time.perf_counter() - started


class Downloads:
    """curl downloads of one artifact, one after another, until stopped; bytes and seconds."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.rates: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            out = subprocess.run(
                [need_tool("curl"), "-sS", "-o", "/dev/null", "-w", "%{size_download} %{time_total}",
                 "-H", f"Authorization: Bearer {ADMIN_TOKEN}", "--max-time", "60", self.url],
                capture_output=True, text=True,
            )
            if out.returncode != 0:
                self.failures += 1
                continue
            got, seconds = out.stdout.split()
            if not self._stop.is_set():
                self.rates.append(int(got) / float(seconds))

    def __enter__(self) -> Downloads:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--part-mib", type=int, default=32, choices=range(8, 65), metavar="8..64")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--download-mib-s", type=int, default=32)
    args = parser.parse_args()
    size, part = args.size_mib * MiB, args.part_mib * MiB

    with BenchCluster() as bench:
        source = bench.workdir / "source.bin"
        make_file(source, size)
        hashes = part_hashes(source, size, part)
        digest = hashlib.sha256()
        with open(source, "rb") as file:
            while chunk := file.read(8 * MiB):
                digest.update(chunk)
        whole = digest.hexdigest()
        writer = bench.writer(
            ARKVORY_DOWNLOAD_BYTES_PER_SECOND=str(args.download_mib_s * MiB), ARKVORY_MIN_FREE_BYTES="0"
        )
        create_repo(writer, "bench")
        small = upload(writer, "bench", "download.bin", 64 * MiB)
        url = writer.url + small["path"]
        with Downloads(url) as alone:
            time.sleep(8)
        references, uploads, during = [], [], []
        for _ in range(args.runs):
            references.append(reference_seconds(source, bench.workdir / "copy.bin"))
            with Downloads(url) as downloads:
                time.sleep(1)
                uploads.append(resumable_upload(writer, source, size, part, hashes, whole))
            during += downloads.rates
            if downloads.failures:
                raise BenchError(f"{downloads.failures} download(s) failed during the upload")
            # The next run publishes the same bytes again: a fresh artifact of an existing blob.

    reference = statistics.median(r for r, _ in references)
    unsynced = statistics.median(u for _, u in references)
    ours = statistics.median(uploads)
    alone_rate = statistics.median(alone.rates) if alone.rates else 0.0
    during_rate = statistics.median(during) if during else 0.0
    speed_ratio = reference / ours
    download_ratio = during_rate / alone_rate if alone_rate else 0.0
    print()
    print(table(
        [
            ("sha256sum + cp + sync (reference)", f"{reference:.2f}", f"{size / MiB / reference:.0f}"),
            ("sha256sum + cp, not synced", f"{unsynced:.2f}", f"{size / MiB / unsynced:.0f}"),
            (f"resumable upload, {args.part_mib} MiB parts, 2 parallel", f"{ours:.2f}", f"{size / MiB / ours:.0f}"),
        ],
        ("what", "seconds (median)", "MiB/s"),
    ))
    print()
    print(table(
        [
            ("downloads alone", f"{alone_rate / MiB:.1f}", str(len(alone.rates))),
            ("downloads during the upload", f"{during_rate / MiB:.1f}", str(len(during))),
        ],
        ("writer downloads (64 MiB each, throttled)", "MiB/s (median)", "downloads"),
    ))
    print()
    print(table(
        [
            ("upload speed / reference", f"{speed_ratio:.2f}", "≥ 0.70", verdict(speed_ratio >= 0.7)),
            ("upload speed / unsynced reference", f"{unsynced / ours:.2f}", "(information)", ""),
            ("download rate during / alone", f"{download_ratio:.2f}", "≥ 0.90", verdict(download_ratio >= 0.9)),
        ],
        ("figure", "ratio", "goal", "result"),
    ))
    print(f"\n({args.runs} runs of {args.size_mib} MiB; part hashes computed before the clock starts)")
    return 0


if __name__ == "__main__":
    bench_main("upload", 1800, main)
