"""`arkvory dev`: a local writer and gateways on an embedded PostgreSQL, in one command.

State (database, storage, keys) lives in one directory, so a second run keeps the artifacts.
The admin token is kept in `<dir>/admin-token` (mode 0600) only so the demo can print it again;
the servers themselves know only its SHA-256 from the keys file.
"""

from __future__ import annotations

import os
import pathlib
import secrets
import signal
import subprocess
import sys
import time
import urllib.request

from .identity import token_digest
from .localpg import start_local_postgres

RATE_PER_SLOT = 64 * 1024 * 1024


def _admin_token(state: pathlib.Path) -> tuple[str, pathlib.Path]:
    token_file, keys_file = state / "admin-token", state / "keys.toml"
    if not token_file.exists() or not keys_file.exists():
        token = f"arkvory_key_{secrets.token_urlsafe(32)}"
        token_file.touch(mode=0o600)
        token_file.write_text(token + "\n")
        keys_file.write_text(
            f'[[key]]\nid = "dev-admin"\nsha256 = "{token_digest(token)}"\nscopes = ["admin"]\n'
        )
    return token_file.read_text().strip(), keys_file


def _wait_ready(url: str, process: subprocess.Popen, limit_s: float = 40.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"arkvory dev: {url} exited with status {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health/status", timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"arkvory dev: {url} did not become ready in {limit_s:.0f} s")


def _stop_on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt  # the same orderly stop as Ctrl-C: drain the servers, stop PostgreSQL


def run_dev_cluster(directory: str, *, gateways: int, base_port: int) -> int:
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    state = pathlib.Path(directory).resolve()
    state.mkdir(parents=True, exist_ok=True)
    database = start_local_postgres(state, fsync=True)
    processes: list[subprocess.Popen] = []
    try:
        token, keys_file = _admin_token(state)
        common = {
            **os.environ,
            "ARKVORY_DATABASE_URL": database.url,
            "ARKVORY_DATA_DIR": str(state / "data"),
            "ARKVORY_KEYS_FILE": str(keys_file),
            "ARKVORY_HOST": "127.0.0.1",
        }
        if gateways:
            slots = gateways + 1
            common |= {
                "ARKVORY_GATEWAY_SLOTS": str(slots),
                "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND": str(RATE_PER_SLOT * slots),
            }
        urls = []
        for slot in range(gateways + 1):
            env = common | {"ARKVORY_PORT": str(base_port + slot)}
            env["ARKVORY_ROLE"] = "api" if slot == 0 else "reader"
            if gateways:
                env["ARKVORY_GATEWAY_SLOT"] = str(slot)
            process = subprocess.Popen([sys.executable, "-m", "shared.cli", "serve"], env=env)
            processes.append(process)
            url = f"http://127.0.0.1:{base_port + slot}"
            _wait_ready(url, process)
            urls.append(url)
        print("\nArkvory is running:")
        print(f"  writer   {urls[0]}   (uploads, changes, downloads)")
        for slot, url in enumerate(urls[1:], start=1):
            print(f"  gateway  {url}   (slot {slot}: GET/HEAD downloads)")
        print(f"  database {database.source} PostgreSQL, state in {state}")
        print(f"  admin key: {token}")
        print(
            f"\nTry:\n  curl -H 'Authorization: Bearer {token}' -H 'content-type: application/json' "
            f"-d '{{\"name\": \"demo\"}}' {urls[0]}/api/v1/repositories\n"
            "Press Ctrl-C to stop.\n",
            flush=True,
        )
        while all(p.poll() is None for p in processes):
            time.sleep(0.5)
        print("arkvory dev: a process stopped; shutting the others down", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                process.kill()
        database.stop()
