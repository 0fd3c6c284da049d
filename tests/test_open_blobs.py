"""The download path's open-blob cache: descriptors are reused, bounded, and never closed while
a transfer still reads them."""

from __future__ import annotations

import os

import pytest

from shared.open_blobs import OpenBlobs


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
