"""Measuring the download budget from outside, shared by tests/test_budget.py (on disk) and
tests/test_s3_budget.py (on an object store), so both hold the same bar the same way."""

from __future__ import annotations

import threading
import time

import httpx

from .harness import ADMIN_TOKEN, READER_TOKEN

KiB = 1024


def make_repo(writer, name: str, data: bytes) -> str:
    """A repository `name` holding `data` as one artifact; returns its content path."""
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": name}).status_code == 201
        answer = client.post(f"/api/v1/repositories/{name}/artifacts", params={"name": "f.bin"}, content=data)
        assert answer.status_code == 201, answer.text
        return f"/api/v1/repositories/{name}/artifacts/{answer.json()['id']}/content"


def timed_download(url: str, token: str, results: list, headers: dict | None = None) -> None:
    started = time.monotonic()
    with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {token}", **(headers or {})}) as client:
        answer = client.get(url)
    results.append((answer.status_code, answer.content, time.monotonic() - started))


def run_parallel(jobs) -> list:
    """(url, token) jobs downloaded at once; their (status, body, seconds), in finishing order."""
    results: list = []
    threads = [threading.Thread(target=timed_download, args=(*job, results)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    return results


def assert_principal_shares(url: str, data: bytes, per_principal: int) -> None:
    """The admin runs two downloads of `data` that share its `per_principal` bytes/s; the reader
    runs one at the same time, which the admin's two do not slow down."""
    results: dict[str, list] = {"admin": [], "reader": []}
    threads = [
        threading.Thread(target=timed_download, args=(url, ADMIN_TOKEN, results["admin"])),
        threading.Thread(target=timed_download, args=(url, ADMIN_TOKEN, results["admin"])),
        threading.Thread(target=timed_download, args=(url, READER_TOKEN, results["reader"])),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    burst = per_principal // 10
    admin_seconds = max(s for _, _, s in results["admin"])
    reader_seconds = results["reader"][0][2]
    assert all(status == 200 and body == data for status, body, _ in results["admin"] + results["reader"])
    assert admin_seconds >= (2 * len(data) - burst) / per_principal * 0.97  # both of the admin's
    assert reader_seconds <= len(data) / per_principal * 1.5  # one share: not slowed by the admin
