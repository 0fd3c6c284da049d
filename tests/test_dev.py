"""`arkvory dev`, the README's one command: PostgreSQL, a writer and a gateway, then a clean stop."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from .harness import ROOT, free_port

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def test_dev_cluster_starts_serves_and_stops(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARKVORY_") and k != "DATABASE_URL"}
    log = tmp_path / "dev.log"
    with open(log, "wb") as out:
        dev = subprocess.Popen(
            [sys.executable, "-m", "shared.cli", "dev", "--dir", str(tmp_path / "state"),
             "--gateways", "1", "--port", str(port)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while "Press Ctrl-C" not in log.read_text() and time.monotonic() < deadline:
            assert dev.poll() is None, log.read_text()
            time.sleep(0.2)
        text = log.read_text()
        token = re.search(r"admin key: (\S+)", text).group(1)
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(headers=headers, timeout=10) as client:
            created = client.post(f"http://127.0.0.1:{port}/api/v1/repositories", json={"name": "demo"})
            assert created.status_code == 201
            uploaded = client.post(
                f"http://127.0.0.1:{port}/api/v1/repositories/demo/artifacts",
                params={"name": "hello.txt"}, content=b"hello",
            ).json()
            got = client.get(
                f"http://127.0.0.1:{port + 1}/api/v1/repositories/demo/artifacts/{uploaded['id']}/content"
            )
            assert got.status_code == 200 and got.content == b"hello"
            assert client.get(f"http://127.0.0.1:{port + 1}/health/ready").json()["role"] == "reader"
    finally:
        dev.send_signal(signal.SIGTERM)
        status = dev.wait(60)
    assert status == 0, log.read_text()
