"""The shared download budget on an object store (SPEC §4, §11): writer + two gateways on other
loopback addresses, sharing nothing but the database and the bucket, hold the total rate with the
same accuracy as on disk (tests/test_budget.py measures it the same way), and a slow principal's
share is not slowed down by the segments the downloads read from the store."""

from __future__ import annotations

import time

import pytest

from .budget_measure import KiB, assert_principal_shares, make_repo, run_parallel
from .harness import ADMIN_TOKEN
from .s3cluster import GATEWAY_HOSTS, loopback_aliases_or_skip

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]









@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
def test_the_total_budget_holds_across_writer_and_gateways_on_the_object_store(s3_cluster):
    loopback_aliases_or_skip(*GATEWAY_HOSTS)
    total = 3 * 256 * KiB  # each of 3 processes: 256 KiB/s, burst 25.6 KiB
    shared = s3_cluster.shared_env(slots=3, total=total)
    writer = s3_cluster.writer(shared).wait_ready()
    data = bytes(range(256)) * 4096  # 1 MiB
    path = make_repo(writer, "budget", data)
    gateways = [s3_cluster.gateway(slot, shared, host=host).wait_ready() for slot, host in zip((1, 2), GATEWAY_HOSTS)]

    started = time.monotonic()
    results = run_parallel([(p.url + path, ADMIN_TOKEN) for p in (writer, *gateways)])
    elapsed = time.monotonic() - started

    assert [status for status, _, _ in results] == [200, 200, 200]
    assert all(body == data for _, body, _ in results)
    burst = min(256 * KiB // 10, 1024 * KiB)
    floor = (3 * len(data) - 3 * burst) / total
    assert elapsed >= floor * 0.97, f"3 MiB at {total} B/s must take >= {floor:.2f} s, took {elapsed:.2f} s"
    # Each process alone is held to its share, not the total...
    assert min(seconds for _, _, seconds in results) >= (len(data) - burst) / (total // 3) * 0.97
    # ...and reading the store in segments costs it no noticeable part of that share.
    assert elapsed <= floor * 1.5, f"took {elapsed:.2f} s for a floor of {floor:.2f} s"
    for process in (writer, *gateways):
        with process.client() as client:
            metrics = client.get("/health/metrics").text
        (line,) = [line for line in metrics.splitlines() if line.startswith("arkvory_download_payload_bytes_total ")]
        assert float(line.split()[1]) == len(data)


@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
def test_per_principal_share_across_hosts_on_the_object_store(s3_cluster):
    loopback_aliases_or_skip(GATEWAY_HOSTS[0])
    shared = s3_cluster.shared_env(
        slots=2, total=2 * 1024 * KiB, ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL=str(2 * 128 * KiB),
    )
    writer = s3_cluster.writer(shared).wait_ready()
    data = b"p" * (256 * KiB)
    path = make_repo(writer, "shares", data)
    gateway = s3_cluster.gateway(1, shared, host=GATEWAY_HOSTS[0]).wait_ready()
    url = gateway.url + path
    assert_principal_shares(url, data, 128 * KiB)  # ~3.9 s for the admin, ~2 s for the reader
