"""The shipped balancer configurations (deploy/haproxy, deploy/nginx) run in front of test
processes: our backends' ports and a free front port put in, the settings that need root or /run
taken out, nothing of the routing or the health checks changed.

    with running_balancer("haproxy", tmp_path, {"127.0.0.1:8080": writer.port, ...}) as front:
        httpx.get(front.url + "/api/v1/...")
"""

from __future__ import annotations

import contextlib
import csv
import pathlib
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping

import httpx
import pytest

from .harness import ROOT, free_port
from .tools import require_tool

DEPLOY = ROOT / "deploy"
HAPROXY_CFG = DEPLOY / "haproxy" / "haproxy.cfg"
NGINX_CONF = DEPLOY / "nginx" / "arkvory.conf"
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0


def retarget(text: str, ports: Mapping[str, int]) -> str:
    """`text` with each shipped backend address (e.g. 127.0.0.1:8081) replaced by 127.0.0.1 and
    the port a test process listens on."""
    for address, port in ports.items():
        assert address in text, f"{address} is not in the configuration"
        text = re.sub(rf"{re.escape(address)}(?!\d)", f"127.0.0.1:{port}", text)
    return text


def haproxy_config(text: str, ports: Mapping[str, int], front: int, stats_socket: str | None = None) -> str:
    """A shipped HAProxy configuration for a test: backends and front port replaced, no user or
    group (root only), the stats socket on the abstract socket `stats_socket` or none (/run is
    root's, and a path under pytest's directories is longer than a socket's 97 characters)."""
    text = retarget(text, ports)
    text, count = re.subn(r"^(\s*)bind\s+:80\s*$", rf"\g<1>bind 127.0.0.1:{front}", text, flags=re.M)
    assert count == 1, "expected one `bind :80`"
    text = re.sub(r"^\s*(user|group)\s.*$", "", text, flags=re.M)
    socket_line = rf"\g<1>stats socket abns@{stats_socket} level admin" if stats_socket is not None else ""
    return re.sub(r"^(\s*)stats socket\s.*$", socket_line, text, flags=re.M)


def nginx_wrapper(directory: pathlib.Path, include: pathlib.Path) -> pathlib.Path:
    """A minimal nginx.conf that includes ours in http {}, with every file under `directory`."""
    for name in ("body", "proxy"):
        (directory / name).mkdir(exist_ok=True)
    wrapper = directory / "nginx.conf"
    wrapper.write_text(
        f"pid {directory}/nginx.pid;\n"
        f"error_log {directory}/error.log;\n"
        "events {}\n"
        "http {\n"
        "    access_log off;\n"
        f"    client_body_temp_path {directory}/body;\n"
        f"    proxy_temp_path {directory}/proxy;\n"
        f"    include {include};\n"
        "}\n"
    )
    return wrapper


def nginx_config(text: str, ports: Mapping[str, int], front: int) -> str:
    """A shipped nginx configuration for a test: backends and front port replaced."""
    text = retarget(text, ports)
    text, count = re.subn(r"^(\s*)listen\s+80;", rf"\g<1>listen 127.0.0.1:{front};", text, flags=re.M)
    assert count == 1, "expected one `listen 80;`"
    return text


class Balancer:
    """A running HAProxy or nginx; `url` is its front."""

    def __init__(self, kind: str, process: subprocess.Popen, front: int, log: pathlib.Path,
                 stats_socket: str | None = None) -> None:
        self.kind = kind
        self.process = process
        self.url = f"http://127.0.0.1:{front}"
        self.log = log
        self.stats_socket = stats_socket

    def wait_answering(self) -> Balancer:
        """Until its front answers at all (any status: the backends may not be ready)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"{self.kind} exited with {self.process.returncode}: {self.log.read_text()}")
            try:
                httpx.get(self.url + "/health/status", timeout=2)
                return self
            except httpx.TransportError:
                time.sleep(0.1)
        pytest.fail(f"{self.kind} did not answer within {START_TIMEOUT_S:.0f} s: {self.log.read_text()}")

    def servers(self) -> dict[tuple[str, str], dict[str, str]]:
        """HAProxy only: `show stat` on the stats socket, as {(backend, server): row}."""
        assert self.stats_socket is not None, "HAProxy with a stats socket only"
        with socket.socket(socket.AF_UNIX) as stats:
            stats.settimeout(5)
            # An abstract socket (no file), whose name HAProxy pads with zeros to sun_path's 108 bytes.
            stats.connect(b"\0" + self.stats_socket.encode().ljust(107, b"\0"))
            stats.sendall(b"show stat\n")
            text = b""
            while chunk := stats.recv(65536):
                text += chunk
        rows = csv.DictReader(text.decode().lstrip("# ").splitlines())
        return {(row["pxname"], row["svname"]): row for row in rows if row["svname"] not in ("FRONTEND", "BACKEND")}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)


def start_haproxy(directory: pathlib.Path, ports: Mapping[str, int], *, config: pathlib.Path = HAPROXY_CFG,
                  stats: bool = False) -> Balancer:
    haproxy = require_tool("haproxy", apt="haproxy")
    directory.mkdir(parents=True, exist_ok=True)
    front = free_port()
    stats_socket = f"arkvory-test-{uuid.uuid4().hex}" if stats else None
    cfg = directory / "haproxy.cfg"
    cfg.write_text(haproxy_config(config.read_text(), ports, front, stats_socket))
    log = directory / "haproxy.log"
    with log.open("wb") as out:
        process = subprocess.Popen([haproxy, "-db", "-f", str(cfg)], stdout=out, stderr=out)
    return Balancer("haproxy", process, front, log, stats_socket)


def start_nginx(directory: pathlib.Path, ports: Mapping[str, int], *, config: pathlib.Path = NGINX_CONF) -> Balancer:
    nginx = require_tool("nginx", apt="nginx-light")
    directory.mkdir(parents=True, exist_ok=True)
    front = free_port()
    conf = directory / "arkvory.conf"
    conf.write_text(nginx_config(config.read_text(), ports, front))
    wrapper = nginx_wrapper(directory, conf)
    log = directory / "stderr.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [nginx, "-p", str(directory), "-c", str(wrapper), "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=out
        )
    return Balancer("nginx", process, front, log)


@contextlib.contextmanager
def running_balancer(kind: str, directory: pathlib.Path, ports: Mapping[str, int], **options) -> Iterator[Balancer]:
    """`kind` ("haproxy" or "nginx") started with the shipped configuration, answering, and
    stopped at the end."""
    start = start_haproxy if kind == "haproxy" else start_nginx
    balancer = start(directory, ports, **options)
    try:
        yield balancer.wait_answering()
    finally:
        balancer.stop()
