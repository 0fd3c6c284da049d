"""The download path's open-blob cache: descriptors are reused, bounded, and never closed while
a transfer still reads them."""

from __future__ import annotations

import os

import pytest

from arkvory.shared.storage.open_blobs import OpenBlobs


@pytest.fixture
def blobs(tmp_path):
    for name in "abcd":
        (tmp_path / name).write_bytes(name.encode() * 10)
    return OpenBlobs(lambda sha: str(tmp_path / sha), capacity=2)


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_a_blob_is_opened_once_and_shared(blobs):
    first = blobs.acquire("a")
    second = blobs.acquire("a")
    assert first == second and os.pread(first, 3, 0) == b"aaa"
    blobs.release("a", first)
    blobs.release("a", second)
    assert is_open(first) and len(blobs) == 1


def test_at_most_capacity_stay_open_and_an_idle_one_pushed_out_is_closed(blobs):
    fds = {}
    for name in "abc":
        fds[name] = blobs.acquire(name)
        blobs.release(name, fds[name])
    assert len(blobs) == 2
    assert not is_open(fds["a"]) and is_open(fds["b"]) and is_open(fds["c"])


def test_a_blob_pushed_out_while_in_use_stays_open_until_its_last_user_leaves(blobs):
    busy = blobs.acquire("a")
    for name in "bc":
        blobs.release(name, blobs.acquire(name))
    assert len(blobs) == 2 and is_open(busy)  # evicted, still readable
    assert os.pread(busy, 2, 0) == b"aa"
    again = blobs.acquire("a")  # a new user gets a fresh descriptor
    assert again != busy
    blobs.release("a", busy)
    assert not is_open(busy) and is_open(again)
    blobs.release("a", again)


def test_a_missing_blob_is_an_error_and_not_remembered(blobs, tmp_path):
    with pytest.raises(FileNotFoundError):
        blobs.acquire("missing")
    assert len(blobs) == 0
    (tmp_path / "missing").write_bytes(b"now")
    fd = blobs.acquire("missing")
    assert os.pread(fd, 3, 0) == b"now"
    blobs.release("missing", fd)


def test_a_blob_idle_longer_than_the_bound_is_closed_on_the_next_acquire(tmp_path):
    for name in "ab":
        (tmp_path / name).write_bytes(b"x")
    now = [0.0]
    blobs = OpenBlobs(lambda sha: str(tmp_path / sha), capacity=8, idle_s=10.0, clock=lambda: now[0])
    idle = blobs.acquire("a")
    blobs.release("a", idle)
    busy = blobs.acquire("b")  # in use: never closed under its reader
    now[0] = 11.0
    other = blobs.acquire("b")
    assert other == busy
    assert not is_open(idle) and is_open(busy) and len(blobs) == 1
    blobs.release("b", busy)
    blobs.release("b", other)


_CLOSES_OF_REMOVED_FILES_ON_THE_LOOP = '''
import os, threading
_log = os.environ["TEST_CLOSE_LOG"]
_close = os.close
def _logging_close(fd):
    if threading.current_thread() is threading.main_thread():
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target.endswith(" (deleted)"):
            with open(_log, "a") as out:
                out.write(target + "\\n")
    _close(fd)
os.close = _logging_close
'''


def test_a_cached_descriptor_of_a_removed_blob_is_closed_off_the_event_loop(cluster, tmp_path):
    """The last close of a removed file frees its blocks (seconds for a multi-GiB blob): a
    gateway whose cached descriptor is the last one left of a blob that was replaced (an upload
    of the same bytes) or deleted closes it in a worker thread, not on its event loop. A
    `sitecustomize` in the gateway logs every close of a removed file on its main thread."""
    import hashlib
    import time

    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(_CLOSES_OF_REMOVED_FILES_ON_THE_LOOP)
    log = tmp_path / "closes-on-the-loop.log"
    log.touch()
    shared = cluster.shared_env(slots=2)
    writer = cluster.writer(shared).wait_ready()
    data = os.urandom(200_000)
    sha256 = hashlib.sha256(data).hexdigest()
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        made = client.post("/api/v1/repositories/r/artifacts", params={"name": "a"}, content=data).json()
    gateway = cluster.gateway(1, shared, PYTHONPATH=str(hooks), TEST_CLOSE_LOG=str(log)).wait_ready()
    with gateway.client() as client:
        assert client.get(f"/api/v1/repositories/r/artifacts/{made['id']}/content").content == data

    def gateway_holds_the_old_file() -> bool:
        for fd in os.listdir(f"/proc/{gateway.proc.pid}/fd"):
            try:
                if os.readlink(f"/proc/{gateway.proc.pid}/fd/{fd}").endswith(f"{sha256} (deleted)"):
                    return True
            except OSError:
                continue
        return False

    with writer.client() as client:  # the same bytes again: the old file is replaced
        assert client.post("/api/v1/repositories/r/artifacts", params={"name": "b"}, content=data).status_code == 201
    deadline = time.monotonic() + 10
    while gateway_holds_the_old_file():
        assert time.monotonic() < deadline, "the gateway kept the replaced file open"
        time.sleep(0.05)
    assert log.read_text() == "", "closed on the gateway's event loop: " + log.read_text()


def test_idle_blobs_are_looked_for_at_most_every_tenth_of_the_idle_bound(tmp_path):
    """The idle sweep runs on an acquire at most every idle_s / 10 (not on every acquire, a
    Python loop per download): an idle blob is closed within 1.1 × idle_s of its last use."""
    for name in "abc":
        (tmp_path / name).write_bytes(b"x")
    now = [0.0]
    closed: list[int] = []
    blobs = OpenBlobs(
        lambda sha: str(tmp_path / sha), capacity=8, idle_s=10.0, clock=lambda: now[0], close=closed.append
    )

    def use(sha256: str, at: float) -> int:
        now[0] = at
        fd = blobs.acquire(sha256)
        blobs.release(sha256, fd)
        return fd

    a = use("a", 0.0)  # sweeps (nothing idle); the next sweep is due at 1.0
    b = use("b", 0.5)
    use("c", 10.4)  # due: "a" (idle 10.4 s) is closed, "b" (9.9 s) kept; next due at 11.44
    assert closed == [a]
    use("c", 10.6)  # "b" is idle 10.1 s now, but no sweep is due: kept until the next one
    assert closed == [a]
    use("c", 11.5)
    assert closed == [a, b] and len(blobs) == 1
    for fd in closed:
        os.close(fd)
