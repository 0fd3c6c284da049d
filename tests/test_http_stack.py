"""Issue 13 item 15: shared/http/protocol.py builds on uvicorn's, httptools' and uvloop's internals, so
their versions are pinned in pyproject.toml and a process on any other version refuses to start
(exit 78), naming the package, the version found and the one needed."""

from __future__ import annotations

import re
import socket
import tomllib

import pytest

from arkvory.shared.http.protocol import HTTP_STACK, http_stack_mismatches

from .harness import ROOT, run_arkvory

pytestmark = pytest.mark.timeout(60)


def test_pyproject_pins_exactly_the_stack_the_protocol_checks():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {}
    for requirement in dependencies:
        found = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^;\s]+)", requirement)
        if found:
            pins[found.group(1).lower()] = found.group(2)
    assert {name: pins.get(name) for name in HTTP_STACK} == HTTP_STACK


def test_the_installed_stack_is_the_pinned_one():
    assert http_stack_mismatches() == []


def test_another_version_is_named_with_the_one_needed():
    installed = {**HTTP_STACK, "httptools": "0.10.0"}

    def version(name: str) -> str:
        if name == "uvloop":
            import importlib.metadata

            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    assert http_stack_mismatches(version) == [
        f"httptools 0.10.0 (needs {HTTP_STACK['httptools']})",
        f"uvloop missing (needs {HTTP_STACK['uvloop']})",
    ]


def test_serve_refuses_to_start_on_another_httptools(cluster, tmp_path):
    # A distribution found first on sys.path is what importlib.metadata reports: an installation
    # where httptools was upgraded behind Arkvory's back.
    shadow = tmp_path / "shadow"
    (shadow / "httptools-0.10.0.dist-info").mkdir(parents=True)
    (shadow / "httptools-0.10.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: httptools\nVersion: 0.10.0\n"
    )
    env = cluster.base_env(ARKVORY_ROLE="api", PYTHONPATH=str(shadow))
    result = run_arkvory(env, "serve", timeout=30)
    assert result.returncode == 78, result.stderr
    assert f"httptools 0.10.0 (needs {HTTP_STACK['httptools']})" in result.stderr
    assert f"'httptools=={HTTP_STACK['httptools']}'" in result.stderr
    assert "applying migration" not in result.stderr  # refused before touching the database
    with socket.socket() as probe:  # and before binding its port
        probe.bind(("127.0.0.1", int(env["ARKVORY_PORT"])))
