"""Demand shares with real processes (issue 23, SPEC §4 "Demand mode"): the total follows the
demand, a killed process's share comes back only after its grant ran out, and the total holds."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from .budget_measure import KiB, make_repo
from .harness import ADMIN_TOKEN, eventually

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

MiB = 1024 * KiB


def ready(process) -> dict:
    with process.client() as client:
        return client.get("/health/ready").json()


def granted_bytes(process) -> int:
    return ready(process)["transfers"]["downloads"]["bandwidth"]["grantedBytes"]


def demand_of(process) -> dict:
    return ready(process)["sharedDownloads"]["demand"]


class Downloader(threading.Thread):
    """Downloads `url` over and over until stopped; counts body bytes."""

    def __init__(self, url: str, token: str = ADMIN_TOKEN) -> None:
        super().__init__(daemon=True)
        self.url, self.token = url, token
        self.received = 0
        self.stop = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {self.token}"}) as client:
            while not self.stop.is_set():
                try:
                    with client.stream("GET", self.url) as answer:
                        for chunk in answer.iter_bytes():
                            self.received += len(chunk)
                            if self.stop.is_set():
                                return
                except httpx.HTTPError as exc:
                    self.errors.append(repr(exc))
                    return


def demand_cluster(cluster, total: int, **extra: str):
    shared = cluster.shared_env(slots=3, total=total, ARKVORY_SHARE_MODE="demand", **extra)
    writer = cluster.writer(shared).wait_ready()
    gateways = [cluster.gateway(slot, shared).wait_ready() for slot in (1, 2)]
    return writer, gateways


def test_one_busy_process_of_three_gets_most_of_the_total(cluster):
    total = 3 * MiB
    writer, gateways = demand_cluster(cluster, total)
    path = make_repo(writer, "busy", b"d" * (64 * MiB))
    assert ready(gateways[0])["sharedDownloads"]["shareMode"] == "demand"
    loader = Downloader(gateways[0].url + path)
    loader.start()
    try:
        eventually(lambda: demand_of(gateways[0])["appliedBytesPerSecond"] >= 0.9 * total, "the busy gateway's share grown", timeout=10)
        before, started = granted_bytes(gateways[0]), time.monotonic()
        time.sleep(3)
        rate = (granted_bytes(gateways[0]) - before) / (time.monotonic() - started)
    finally:
        loader.stop.set()
        loader.join(10)
    print("rate", rate / total, demand_of(gateways[0]), demand_of(writer))
    assert rate >= 0.85 * total
