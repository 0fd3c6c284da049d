"""Checks of what deploy/, the Dockerfile and docker-compose.yml ship to operators.

The unit files, env examples and compose file are parsed and held to SPEC §2/§8/§9; nginx and
HAProxy validate their own configurations and then run briefly in front of three stub backends,
to prove the routing (GET/HEAD of the content routes spread over all, the rest to the writer).
"""

from __future__ import annotations

import configparser
import http.server
import json
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import threading
import tomllib
import uuid
from collections.abc import Iterator, Mapping

import httpx
import pytest
from arkvory.shared.settings import Settings

from .balancers import nginx_wrapper, running_balancer
from .harness import eventually, free_port
from .tools import require_tool

pytestmark = pytest.mark.timeout(60)

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
UNITS = DEPLOY / "systemd"
ENV = DEPLOY / "env"
NGINX_CONF = DEPLOY / "nginx" / "arkvory.conf"
HAPROXY_CFG = DEPLOY / "haproxy" / "haproxy.cfg"

WRITER = "127.0.0.1:8080"
GATEWAYS = ("127.0.0.1:8081", "127.0.0.1:8082")
# Exit statuses a restart cannot fix (SPEC §4, §9): bad settings, slot busy, refused.
NO_RESTART = {2, 3, 78}
EXIT_LEASE_LOST = 75
# Seconds a SIGTERMed process may need beyond the drain bound: uvicorn's graceful stop (5 s),
# closing the pool (5 s) and the database connections; the units document the same margin.
STOP_MARGIN_S = 15
PLACEHOLDER_DB_PASSWORD = "test-password"


# -- readers ------------------------------------------------------------------------------


class _EveryValue(dict):
    """systemd allows a key more than once (Environment=, EnvironmentFile=): keep them all.

    configparser stores each new value as a one-element list before joining lines; extending
    instead of replacing leaves every value, one per line.
    """

    def __setitem__(self, key, value):
        if isinstance(value, list) and isinstance(self.get(key), list):
            self[key].extend(value)
        else:
            super().__setitem__(key, value)


def read_unit(path: pathlib.Path) -> dict[str, dict[str, list[str]]]:
    parser = configparser.ConfigParser(
        strict=False, interpolation=None, dict_type=_EveryValue, empty_lines_in_values=False
    )
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read(path, encoding="utf-8")
    return {
        name: {key: parser.get(name, key).splitlines() for key in parser.options(name)}
        for name in parser.sections()
    }


def read_env_file(path: pathlib.Path) -> dict[str, str]:
    """A systemd EnvironmentFile: VAR=value lines, comments with # or ;."""
    values = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        name, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", name), f"{path.name}:{number}: {line!r}"
        values[name] = value.strip().strip("\"'")
    return values


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)\s*(s|sec|min|m)?", value.strip())
    assert match, f"unexpected time span {value!r}"
    return int(match.group(1)) * (60 if match.group(2) in ("min", "m") else 1)


def covers(paths: list[str], target: str) -> bool:
    """True when `target` is one of `paths` or lies below one ('-' prefixes allowed)."""
    target_path = pathlib.PurePosixPath(target)
    for entry in paths:
        for word in entry.split():
            base = pathlib.PurePosixPath(word.lstrip("-+"))
            if target_path == base or base in target_path.parents:
                return True
    return False


def settings_from(environ: Mapping[str, str], tmp_path: pathlib.Path) -> Settings:
    """Settings as the process would build them; the keys file is swapped for a real one."""
    keys = tmp_path / "keys.toml"
    keys.write_text("")
    return Settings.from_env({**environ, "ARKVORY_KEYS_FILE": str(keys)})


# -- systemd units ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def common_env() -> dict[str, str]:
    return read_env_file(ENV / "common.env.example")


@pytest.fixture(scope="module")
def units() -> dict[str, dict[str, dict[str, list[str]]]]:
    return {
        name: read_unit(UNITS / f"arkvory-{name}.service")
        for name in ("writer", "gateway@", "worker")
    }


@pytest.mark.parametrize(
    "name, command", [("writer", "serve"), ("gateway@", "serve"), ("worker", "worker")]
)
def test_unit_runs_arkvory_and_restarts_only_when_it_helps(units, common_env, name, command):
    service = units[name]["Service"]
    argv = shlex.split(service["ExecStart"][-1])
    assert pathlib.PurePosixPath(argv[0]).name == "arkvory" and argv[1:] == [command]
    assert service["Restart"] == ["on-failure"]
    prevented = {int(s) for line in service["RestartPreventExitStatus"] for s in line.split()}
    expected = NO_RESTART - ({3} if name == "worker" else set())  # the worker has no slot
    assert expected <= prevented
    assert EXIT_LEASE_LOST not in prevented, "a lost lease must be restarted"
    assert "0" in " ".join(service["SuccessExitStatus"]).split()
    assert seconds(service["RestartSec"][-1]) <= 5
    # A replacement on the same slot may wait 15 s for the old reservation.
    assert seconds(service["TimeoutStartSec"][-1]) >= 30
    drain = int(common_env.get("ARKVORY_DRAIN_TIMEOUT_SECONDS", "30"))
    assert seconds(service["TimeoutStopSec"][-1]) >= drain + STOP_MARGIN_S
    assert service["User"][-1] not in ("root", "0")
    assert "/etc/arkvory/common.env" in service["EnvironmentFile"]


@pytest.mark.parametrize("name", ["writer", "gateway@", "worker"])
def test_units_wait_for_ready_and_watch_the_process(units, name):
    """Type=notify: started means ready (lease held, listening); the watchdog kills a wedged
    process. Only the main process may notify (tests/test_systemd.py runs the protocol)."""
    service = units[name]["Service"]
    assert service["Type"] == ["notify"]
    assert service["NotifyAccess"] == ["main"]
    watchdog = seconds(service["WatchdogSec"][-1])
    # Pings come every WatchdogSec/4 from the serving loop: long enough that a pause of the
    # loop (a collection, a slow disk) costs no kill, short enough that a wedged one goes soon.
    assert 10 <= watchdog <= 60
    # A stalled database stops the pings within the 8 s trust; start-up may wait 15 s for a slot.
    assert seconds(service["TimeoutStartSec"][-1]) >= 30


def test_writer_unit_may_write_the_storage(units, common_env):
    service = units["writer"]["Service"]
    assert "ARKVORY_ROLE=api" in " ".join(service["Environment"]).split()
    assert service["EnvironmentFile"][-1] == "/etc/arkvory/writer.env", "writer.env must win"
    writable = service.get("ReadWritePaths", []) + [
        f"/var/lib/{d}" for line in service.get("StateDirectory", []) for d in line.split()
    ]
    assert covers(writable, common_env["ARKVORY_DATA_DIR"])


def test_gateway_unit_takes_its_slot_from_the_instance_and_reads_storage_only(units, common_env):
    service = units["gateway@"]["Service"]
    assignments = " ".join(service["Environment"]).split()
    assert "ARKVORY_ROLE=reader" in assignments
    assert "ARKVORY_GATEWAY_SLOT=%i" in assignments
    assert service["EnvironmentFile"] == ["/etc/arkvory/common.env", "/etc/arkvory/gateway-%i.env"]
    data_dir = common_env["ARKVORY_DATA_DIR"]
    assert covers(service["ReadOnlyPaths"], data_dir)
    assert not covers(service.get("ReadWritePaths", []), data_dir)
    assert "StateDirectory" not in service, "a StateDirectory would make storage writable"
    assert "arkvory-writer.service" in " ".join(units["gateway@"]["Unit"]["After"]).split()


def test_units_pass_systemd_analyze_verify(tmp_path):
    analyze = require_tool("systemd-analyze", apt="systemd", why="the configparser checks above still ran")
    # verify insists that ExecStart= exists: point it at this environment's console script.
    executable = pathlib.Path(sys.executable).with_name("arkvory")
    if not executable.exists():
        executable = pathlib.Path(shutil.which("true") or "/bin/true")
    names = []
    for source in sorted(UNITS.glob("*.service")):
        text = source.read_text().replace("/opt/arkvory/bin/arkvory", str(executable))
        name = source.name.replace("@.service", "@1.service")
        (tmp_path / name).write_text(text)
        names.append(name)
    result = subprocess.run(
        [analyze, "verify", "--man=no", *names],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    # Unknown keys and unparsable values are only warnings (status 0), tagged with the file path.
    complaints = [line for line in result.stderr.splitlines() if str(tmp_path) in line]
    assert result.returncode == 0 and not complaints, result.stderr


# -- env examples -------------------------------------------------------------------------


def test_env_files_leave_per_process_identity_to_the_units(common_env):
    # EnvironmentFile= overrides Environment=: these would defeat the unit's role and slot.
    assert not {"ARKVORY_ROLE", "ARKVORY_GATEWAY_SLOT", "ARKVORY_PORT"} & common_env.keys()
    gateway = read_env_file(ENV / "gateway-1.env.example")
    assert not {"ARKVORY_ROLE", "ARKVORY_GATEWAY_SLOT"} & gateway.keys()


def test_env_examples_build_valid_settings_for_writer_and_gateway(common_env, tmp_path):
    writer = settings_from(
        {"ARKVORY_ROLE": "api", **common_env, **read_env_file(ENV / "writer.env.example")},
        tmp_path,
    )
    # The unit's Environment= first, then the files, as systemd applies them.
    gateway = settings_from(
        {
            "ARKVORY_ROLE": "reader",
            "ARKVORY_GATEWAY_SLOT": "1",
            **common_env,
            **read_env_file(ENV / "gateway-1.env.example"),
        },
        tmp_path,
    )
    assert writer.is_writer and writer.shared is not None and writer.shared.slot == 0
    assert not gateway.is_writer and gateway.shared is not None and gateway.shared.slot == 1
    assert writer.shared.slots >= 1 + len(GATEWAYS)
    same = ("slots", "total_bytes_per_second", "per_principal_bytes_per_second")
    assert [getattr(writer.shared, f) for f in same] == [getattr(gateway.shared, f) for f in same]
    assert f"{writer.host}:{writer.port}" == WRITER
    assert f"{gateway.host}:{gateway.port}" == GATEWAYS[0]


def test_worker_env_example_builds_valid_worker_settings(common_env, tmp_path):
    from arkvory.writer.worker.startup import worker_settings

    worker_env = read_env_file(ENV / "worker.env.example")
    keys = tmp_path / "keys.toml"
    keys.write_text("")
    settings = worker_settings({**common_env, **worker_env, "ARKVORY_KEYS_FILE": str(keys)})
    assert settings.worker_port == int(worker_env["ARKVORY_WORKER_PORT"])
    assert settings.verify_bytes_per_second == int(worker_env["ARKVORY_VERIFY_BYTES_PER_SECOND"])
    assert settings.cleanup_grace_s == 3600 and settings.task_retention_s == 7 * 86400
    # The same common.env with demand shares (issue 23): the mode is the servers', not the worker's.
    demand = worker_settings({**common_env, "ARKVORY_SHARE_MODE": "demand", **worker_env, "ARKVORY_KEYS_FILE": str(keys)})
    assert demand.worker_port == settings.worker_port


# -- balancer configurations ---------------------------------------------------------------


def _nginx_upstreams(text: str, *, backup: bool = False) -> dict[str, list[str]]:
    """Each upstream's servers: the primary ones, or (backup=True) the backup ones."""
    blocks = re.findall(r"upstream\s+(\w+)\s*\{(.*?)\}", text, re.S)
    servers = {name: re.findall(r"^\s*server\s+(\S+?)([\s;].*)$", body, re.M) for name, body in blocks}
    return {name: [address for address, rest in found if (" backup" in rest) == backup]
            for name, found in servers.items()}


def _haproxy_backends(text: str) -> dict[str, list[str]]:
    sections = re.split(r"^(?=\S)", text, flags=re.M)
    backends = {}
    for section in sections:
        head = re.match(r"backend\s+(\S+)", section)
        if head:
            backends[head.group(1)] = re.findall(r"^\s+server\s+\S+\s+(\S+)", section, re.M)
    return backends


def test_balancers_send_content_to_all_and_the_rest_to_the_writer_only():
    nginx = NGINX_CONF.read_text()
    haproxy = HAPROXY_CFG.read_text()
    assert sorted(_nginx_upstreams(nginx).values()) == sorted([[WRITER], [WRITER, *GATEWAYS]])
    # The content servers again as backups (never marked failed): a store outage's 503s mark the
    # primaries failed, and without these nginx would answer the cached blobs' downloads itself.
    assert _nginx_upstreams(nginx, backup=True) == {"arkvory_writer": [], "arkvory_content": [WRITER, *GATEWAYS]}
    assert len(re.findall(r"^\s*server\s.*\sbackup max_fails=0;", nginx, re.M)) == 3
    assert sorted(_haproxy_backends(haproxy).values()) == sorted([[WRITER], [WRITER, *GATEWAYS]])
    for directive in ("proxy_buffering off;", "proxy_request_buffering off;"):
        assert re.search(rf"^\s*{re.escape(directive)}", nginx, re.M), directive
    assert not re.search(r"^\s*option\s+http-buffer-request", haproxy, re.M)
    # Active checks: every backend asks /health/status, every server is checked.
    assert haproxy.count("uri /health/status") == len(_haproxy_backends(haproxy))
    for line in re.findall(r"^\s+server\s.*$", haproxy, re.M):
        assert " check" in line or re.search(r"^\s*default-server\s.*\bcheck\b", haproxy, re.M)


def test_haproxy_accepts_the_configuration():
    haproxy = require_tool("haproxy", apt="haproxy")
    result = subprocess.run(
        [haproxy, "-c", "-f", str(HAPROXY_CFG)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout + result.stderr, result.stdout + result.stderr


def test_nginx_accepts_the_configuration(tmp_path):
    nginx = require_tool("nginx", apt="nginx-light")
    wrapper = nginx_wrapper(tmp_path, NGINX_CONF)
    result = subprocess.run(
        [nginx, "-t", "-p", str(tmp_path), "-c", str(wrapper)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert "[warn]" not in result.stderr, result.stderr


# -- the balancers in front of stub backends -----------------------------------------------


class _StubHandler(http.server.BaseHTTPRequestHandler):
    """Answers every request with who it is and what it received."""

    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        received = len(self.rfile.read(length)) if length else 0
        body = json.dumps(
            {
                "backend": self.server.name,
                "method": self.command,
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "received": received,
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Stub", self.server.name)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _answer

    def log_message(self, format, *args) -> None:
        pass


class _Stub(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, name: str) -> None:
        super().__init__(("127.0.0.1", 0), _StubHandler)
        self.name = name

    def handle_error(self, request, client_address) -> None:
        # HAProxy's health checks hang up once they have the status line; that is not a failure.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@pytest.fixture
def stubs() -> Iterator[dict[str, _Stub]]:
    """One stub per shipped backend address: the writer and the two gateways."""
    names = ("writer", "gateway1", "gateway2")
    servers = {address: _Stub(name) for address, name in zip((WRITER, *GATEWAYS), names)}
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers.values()]
    for thread in threads:
        thread.start()
    yield servers
    for server in servers.values():
        server.shutdown()
        server.server_close()
    for thread in threads:
        thread.join(5)


@pytest.mark.parametrize("balancer", ["nginx", "haproxy"])
def test_balancer_routes_content_reads_to_all_and_everything_else_to_the_writer(
    balancer, stubs, tmp_path
):
    ports = {address: stub.server_address[1] for address, stub in stubs.items()}
    with running_balancer(balancer, tmp_path, ports) as front:
        with httpx.Client(base_url=front.url, timeout=10) as client:
            eventually(lambda: client.get("/health/status").status_code == 200, f"{balancer} forwards", timeout=15)
            _check_routing(client)


@pytest.mark.parametrize("balancer", ["nginx", "haproxy"])
def test_a_balancer_with_no_process_answering_sends_arkvorys_503_with_retry_after(balancer, tmp_path):
    """Every backend down: the balancer's own answer is the JSON error and Retry-After a process
    would send (SPEC §6: every 503 carries Retry-After), for content and for the writer alike."""
    nobody = {address: free_port() for address in (WRITER, *GATEWAYS)}  # nothing listens there
    with running_balancer(balancer, tmp_path, nobody) as front:
        with httpx.Client(base_url=front.url, timeout=30) as client:
            for method, path in (("GET", f"/api/v1/repositories/builds/artifacts/{uuid.uuid4()}/content"),
                                 ("GET", "/api/v1/repositories"), ("POST", "/api/v1/repositories/builds/artifacts")):
                answer = client.request(method, path, content=b"x" if method == "POST" else None)
                assert answer.status_code == 503, f"{balancer} {method} {path}: {answer.status_code} {answer.text}"
                assert answer.headers["Retry-After"] == "2"
                body = answer.json()
                assert body["code"] == "unavailable" and body["requestId"] == answer.headers["X-Request-Id"] != ""


def _check_routing(client: httpx.Client) -> None:
    artifact = uuid.uuid4()
    content = [
        f"/api/v1/repositories/builds/artifacts/{artifact}/content",
        "/api/v1/repositories/builds/packages/content?group=org.example&name=tool&version=1.2.3",
        "/api/v1/repositories/builds/asset/content?path=latest/tool.tar.gz",
    ]
    conditional = {
        "Authorization": "Bearer arkvory_key_test",
        "Range": "bytes=0-99",
        "If-Range": '"sha256-abc"',
        "If-None-Match": '"sha256-abc"',
    }
    everyone = {"writer", "gateway1", "gateway2"}
    for path in content:
        for method in ("GET", "HEAD"):
            # Consecutive requests of one kind, so that a round robin meets every backend.
            seen = set()
            for _ in range(6):
                answer = client.request(method, path, headers=conditional)
                assert answer.status_code == 200, answer.text
                seen.add(answer.headers["X-Stub"])
                if method == "GET":
                    got = answer.json()
                    assert got["method"] == "GET" and got["path"] == path
                    for name, value in conditional.items():
                        assert got["headers"].get(name.lower()) == value, f"{name} not forwarded"
            assert seen == everyone, f"{method} {path} reached only {seen}"

    # The writer is in the pool too, so each must-reach-the-writer request is sent several times:
    # one that were spread would meet a gateway within three tries.
    writer_only = [
        ("POST", content[0]),
        ("PUT", content[1]),
        ("DELETE", content[2]),
        ("PATCH", content[0]),
        ("OPTIONS", content[0]),
        ("GET", f"/api/v1/repositories/builds/artifacts/{artifact}"),
        ("GET", f"/api/v1/repositories/builds/artifacts/{artifact}/content/extra"),
        ("GET", "/api/v1/repositories/builds/packages/content/extra"),
        ("GET", "/api/v1/repositories/builds/packages"),
        ("GET", "/api/v1/repositories/builds/uploads/u1"),
        ("GET", "/api/v1/repositories"),
        ("GET", "/console/"),
        ("GET", "/health/ready"),
    ]
    for method, path in writer_only:
        for _ in range(3):
            answer = client.request(method, path, headers={"Authorization": "Bearer k"})
            reached = answer.headers.get("X-Stub")
            assert reached == "writer", f"{method} {path} reached {reached}"

    # Uploads reach the writer whole (streamed, not cut by a body limit).
    body = b"x" * (3 * 1024 * 1024)
    answer = client.post("/api/v1/repositories/builds/artifacts", content=body)
    assert answer.json()["backend"] == "writer" and answer.json()["received"] == len(body)


# -- Docker ------------------------------------------------------------------------------------


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
        for line in (raw.strip() for raw in text.splitlines())
        if line and not line.startswith("#")
    ]


def test_dockerfile_installs_every_package_and_runs_serve_as_non_root():
    instructions = _dockerfile_instructions()
    assert instructions[0] == ("FROM", "python:3.11-slim")
    copied = {
        pathlib.PurePosixPath(word).name
        for op, args in instructions
        if op == "COPY"
        for word in args.split()[:-1]
    }
    for word in copied:
        assert (ROOT / word).exists(), f"Dockerfile copies {word}, which does not exist"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["package-dir"] == {"arkvory": "."}
    for package in project["tool"]["setuptools"]["packages"]:
        # arkvory is the root's __init__.py; arkvory.shared.x lives under shared/
        top = package.split(".")[1] if "." in package else "__init__.py"
        assert top in copied, f"package {package} is not copied into the image ({top})"
    runs = [args for op, args in instructions if op == "RUN"]
    assert any(re.search(r"\bpip install -r requirements\.lock(\s|$)", args) for args in runs)
    assert any(re.search(r"\bpip install --no-deps \.(\s|$)", args) for args in runs)
    users = [args for op, args in instructions if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    cmd = [args for op, args in instructions if op == "CMD"]
    assert json.loads(cmd[-1]) == ["arkvory", "serve"]
    assert any(op == "HEALTHCHECK" and "/health/status" in args for op, args in instructions)


def _interpolate(value, environ: Mapping[str, str]):
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} for the values in this file."""
    if isinstance(value, dict):
        return {k: _interpolate(v, environ) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, environ) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match) -> str:
        name, operator, argument = match.group(1), match.group(2) or "", match.group(3) or ""
        if name in environ and (environ[name] or ":" not in operator):
            return environ[name]
        if operator.endswith("?"):
            raise AssertionError(f"compose needs {name}: {argument}")
        return argument if operator.endswith("-") else ""

    value = re.sub(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}", substitute, value)
    return value.replace("$$", "$")


def _environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {k: str(v) for k, v in env.items()}


def _mounts(service: dict) -> list[tuple[str, str, bool]]:
    mounts = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            read_only = bool(volume.get("read_only"))
            mounts.append((volume.get("source", ""), volume["target"], read_only))
        else:
            parts = volume.split(":")
            mode = parts[2] if len(parts) > 2 else "rw"
            mounts.append((parts[0], parts[1], "ro" in mode.split(",")))
    return mounts


def _published(service: dict) -> list[tuple[int, int]]:
    ports = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            ports.append((int(port["published"]), int(port["target"])))
        else:
            parts = str(port).split(":")
            ports.append((int(parts[-2]), int(parts[-1])))
    return ports


@pytest.fixture(scope="module")
def compose() -> dict:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    document = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return _interpolate(document, {"ARKVORY_DB_PASSWORD": PLACEHOLDER_DB_PASSWORD})


def _compose_spec_errors(document: dict) -> list[str]:
    import importlib.resources

    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed")
    vendor = pytest.importorskip(
        "check_jsonschema.builtin_schemas.vendor", reason="check-jsonschema (the Compose Specification's schema)"
    )
    schema = json.loads(importlib.resources.files(vendor).joinpath("compose-spec.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(document)]


def test_compose_file_follows_the_compose_specification():
    """docker-compose.yml uses the Compose Specification (top-level `name`, `depends_on.required`),
    which the old Python docker-compose 1.x refuses: it is held to the specification's own JSON
    schema (as vendored by check-jsonschema), so `docker compose` 2.20+ reads it."""
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    document = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert _compose_spec_errors(document) == []
    # The schema has teeth: a misspelt service key and a wrong condition are refused.
    broken = json.loads(json.dumps(document))
    writer = broken["services"]["writer"]
    writer["enviroment"] = {}
    assert any("enviroment" in error for error in _compose_spec_errors(broken))
    gateway = next(s for s in broken["services"].values() if "writer" in (s.get("depends_on") or {}))
    gateway["depends_on"]["writer"]["condition"] = "service_ready"
    assert any("service_ready" in error for error in _compose_spec_errors(broken))


def test_compose_runs_one_writer_and_gateways_on_distinct_slots_and_ports(compose):
    services = compose["services"]
    arkvory = {n: s for n, s in services.items() if "ARKVORY_ROLE" in _environment(s)}
    envs = {n: _environment(s) for n, s in arkvory.items()}
    writers = [n for n, e in envs.items() if e["ARKVORY_ROLE"] == "api"]
    gateways = sorted(n for n, e in envs.items() if e["ARKVORY_ROLE"] == "reader")
    assert len(writers) == 1 and len(gateways) >= 1 and len(writers) + len(gateways) == len(envs)
    (writer,) = writers

    shared = (
        "ARKVORY_GATEWAY_SLOTS",
        "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND",
        "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL",
        "ARKVORY_DATABASE_URL",
        "ARKVORY_DATA_DIR",
        "ARKVORY_KEYS_FILE",
    )
    for name in shared:
        values = {envs[n].get(name) for n in envs}
        assert len(values) == 1 and None not in values, f"{name} differs between services: {values}"
    assert int(envs[writer]["ARKVORY_GATEWAY_SLOTS"]) == len(envs)
    assert envs[writer].get("ARKVORY_GATEWAY_SLOT") == "0"
    slots = sorted(int(envs[n]["ARKVORY_GATEWAY_SLOT"]) for n in gateways)
    assert slots == list(range(1, len(gateways) + 1))

    ports = [int(envs[n]["ARKVORY_PORT"]) for n in envs]
    assert len(set(ports)) == len(ports), f"every process needs its own port: {ports}"
    published = {n: _published(arkvory[n]) for n in envs}
    host_ports = [host for n in envs for host, _ in published[n]]
    assert len(set(host_ports)) == len(host_ports)
    for n in envs:
        assert [target for _, target in published[n]] == [int(envs[n]["ARKVORY_PORT"])]
    # Published where deploy/nginx and deploy/haproxy look for them.
    assert f"127.0.0.1:{published[writer][0][0]}" == WRITER
    assert sorted(f"127.0.0.1:{published[n][0][0]}" for n in gateways) == sorted(GATEWAYS)


def test_compose_shares_one_storage_volume_read_only_in_gateways(compose):
    services = compose["services"]
    data_dir = None
    sources = set()
    for name, service in services.items():
        env = _environment(service)
        if "ARKVORY_ROLE" not in env:
            continue
        data_dir = env["ARKVORY_DATA_DIR"]
        storage = [m for m in _mounts(service) if m[1] == data_dir]
        assert len(storage) == 1, f"{name} must mount the storage at {data_dir}"
        source, _, read_only = storage[0]
        sources.add(source)
        assert read_only == (env["ARKVORY_ROLE"] == "reader"), f"{name}: read_only={read_only}"
    assert len(sources) == 1 and next(iter(sources)) in (compose.get("volumes") or {})


def test_compose_runs_the_worker_after_the_writer_on_the_writers_storage(compose):
    services = compose["services"]
    (worker,) = [s for s in services.values() if s.get("command") == ["arkvory", "worker"]]
    writer = services["writer"]
    env, writer_env = _environment(worker), _environment(writer)
    for name in ("ARKVORY_DATABASE_URL", "ARKVORY_DATA_DIR", "ARKVORY_KEYS_FILE"):
        assert env[name] == writer_env[name]
    storage = [m for m in _mounts(worker) if m[1] == env["ARKVORY_DATA_DIR"]]
    assert len(storage) == 1 and storage[0][2] is False, "cleanup writes the storage"
    assert worker["depends_on"]["writer"]["condition"] == "service_healthy"
    test = " ".join(worker["healthcheck"]["test"])
    assert f"127.0.0.1:{env['ARKVORY_WORKER_PORT']}/health/live" in test


def test_compose_orders_start_up_checks_health_and_drains(compose):
    services = compose["services"]
    postgres = services["postgres"]
    assert postgres["image"] == "postgres:15"
    command = postgres["command"]
    command = " ".join(command) if isinstance(command, list) else command
    for setting in ("tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count"):
        assert f"{setting}=" in command
    keys = set()
    for name, service in services.items():
        env = _environment(service)
        if "ARKVORY_ROLE" not in env:
            continue
        test = service["healthcheck"]["test"]
        assert "/health/status" in (" ".join(test) if isinstance(test, list) else test)
        drain = int(env.get("ARKVORY_DRAIN_TIMEOUT_SECONDS", "30"))
        assert seconds(service["stop_grace_period"]) >= drain + STOP_MARGIN_S
        needs = "postgres" if env["ARKVORY_ROLE"] == "api" else "writer"
        assert service["depends_on"][needs]["condition"] == "service_healthy"
        secrets = [s if isinstance(s, str) else s["source"] for s in service.get("secrets", [])]
        assert env["ARKVORY_KEYS_FILE"] in [f"/run/secrets/{s}" for s in secrets]
        keys.add(env["ARKVORY_KEYS_FILE"])
    assert len(keys) == 1


def test_compose_environment_builds_valid_settings(compose, tmp_path):
    for name, service in compose["services"].items():
        env = _environment(service)
        if "ARKVORY_ROLE" in env:
            settings = settings_from(env, tmp_path)
            assert settings.shared is not None, f"{name} must run with the shared budget"


# -- several hosts on an object store (SPEC §11) --------------------------------------------------

MULTI = DEPLOY / "multi-host"
S3_COMPOSE_ENV = {
    "ARKVORY_DB_PASSWORD": PLACEHOLDER_DB_PASSWORD,
    "COMPOSE_PROFILES": "s3",
    "ARKVORY_STORAGE_URL": "s3://arkvory",
    "ARKVORY_S3_ENDPOINT_URL": "http://seaweedfs:8333",
    "ARKVORY_GATEWAY_DATA_DIR": "/var/lib/arkvory/local",
    "S3_ACCESS_KEY_ID": "arkvory",
    "S3_SECRET_ACCESS_KEY": "test-secret",
}


def test_compose_s3_profile_runs_seaweedfs_and_points_every_process_at_the_bucket(tmp_path):
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    raw = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    compose = _interpolate(raw, S3_COMPOSE_ENV)
    services = compose["services"]
    seaweedfs, bucket = services["seaweedfs"], services["seaweedfs-bucket"]
    assert seaweedfs["profiles"] == ["s3"] and bucket["profiles"] == ["s3"]
    command = _weed_server_arguments(seaweedfs)
    assert "-s3" in command and "-s3.port=8333" in command
    assert "-s3.autoCreateBucket=false" in command  # a mistyped bucket must fail, not appear
    assert "-s3.config=/run/secrets/seaweedfs-s3" in command and seaweedfs["secrets"] == ["seaweedfs-s3"]
    assert "seaweedfs-s3" in compose["secrets"]
    assert "ports" not in seaweedfs  # nothing of the store on the host
    assert bucket["depends_on"]["seaweedfs"]["condition"] == "service_healthy"
    assert "s3.bucket.create -name arkvory" in bucket["command"][0]
    writer_needs = services["writer"]["depends_on"]["seaweedfs-bucket"]
    assert writer_needs == {"condition": "service_completed_successfully", "required": False}

    arkvory = {n: s for n, s in services.items() if "ARKVORY_ROLE" in _environment(s)}
    local_dirs = set()
    for name, service in arkvory.items():
        env = _environment(service)
        settings = settings_from(env, tmp_path)
        assert settings.storage_url == "s3://arkvory", name
        assert settings.object_store.endpoint_url == "http://seaweedfs:8333"
        assert settings.object_store.access_key_id == "arkvory" and "test-secret" not in repr(settings)
        if env["ARKVORY_ROLE"] == "reader":
            # A gateway's local state is a volume of its own, writable, shared with no one.
            (mount,) = [m for m in _mounts(service) if m[1] == env["ARKVORY_DATA_DIR"]]
            assert mount[2] is False and mount[0] in compose["volumes"]
            local_dirs.add(mount[0])
    assert len(local_dirs) == len([s for s in arkvory.values() if _environment(s)["ARKVORY_ROLE"] == "reader"])
    # The worker keeps the writer's local state (it sweeps the writer's upload files).
    worker = next(s for s in services.values() if s.get("command") == ["arkvory", "worker"])
    assert _environment(worker)["ARKVORY_DATA_DIR"] == _environment(services["writer"])["ARKVORY_DATA_DIR"]
    from arkvory.writer.worker.startup import worker_settings

    keys = tmp_path / "keys.toml"
    assert worker_settings({**_environment(worker), "ARKVORY_KEYS_FILE": str(keys)}).storage_url == "s3://arkvory"


def _weed_server_arguments(seaweedfs: dict) -> list[str]:
    """The arguments of the `weed server` that the seaweedfs service's script ends in."""
    assert seaweedfs["entrypoint"] == ["/bin/sh", "-c"]
    script = seaweedfs["command"][0]
    exec_line = script[script.index("exec /usr/bin/weed"):].replace("\\\n", " ")
    words = exec_line.split()
    assert words[:4] == ["exec", "/usr/bin/weed", "-logtostderr=true", "server"], words
    return words[4:]


def test_compose_seaweedfs_serves_blobs_through_s3_alone(tmp_path):
    """Issue 22: the filer's HTTP API gave every blob and listing to anyone on the network (with
    CORS `*`), the master's a write token; the volume server's reads need a signed token, with
    keys the script makes anew at each start (run here: the image's shell and coreutils only)."""
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    raw = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    seaweedfs = _interpolate(raw, S3_COMPOSE_ENV)["services"]["seaweedfs"]
    arguments = _weed_server_arguments(seaweedfs)
    assert "-disableHttp" in arguments and "-filer" in arguments
    assert "-s3.allowedOrigins=https://no-browser.invalid" in arguments
    assert not any(a.startswith(("-filer.port.public", "-volume.port.public")) for a in arguments)

    script = seaweedfs["command"][0]
    config_dir = tmp_path / "etc"
    keys_part = script[:script.index("exec /usr/bin/weed")].replace("/etc/seaweedfs", str(config_dir))
    made = []
    for _ in range(2):
        subprocess.run(["sh", "-c", keys_part], check=True, timeout=30)
        written = config_dir / "security.toml"
        assert written.stat().st_mode & 0o777 == 0o600
        config = tomllib.loads(written.read_text())
        write_key, read_key = config["jwt"]["signing"]["key"], config["jwt"]["signing"]["read"]["key"]
        assert len(write_key) == len(read_key) == 43 and write_key != read_key
        assert config["cors"]["allowed_origins"]["values"] == "https://no-browser.invalid"
        made += [write_key, read_key]
    assert len(set(made)) == 4  # new at each start
    assert not any(key in yaml.safe_dump(raw) for key in made)


def test_compose_without_the_profile_keeps_the_storage_directory(compose, tmp_path):
    for name, service in compose["services"].items():
        env = _environment(service)
        if "ARKVORY_ROLE" in env:
            assert settings_from(env, tmp_path).object_store is None, name


@pytest.fixture(scope="module")
def multi_host() -> dict[str, dict[str, str]]:
    env = MULTI / "env"
    common = read_env_file(env / "common.env.example")
    return {
        "common": common,
        "writer": {"ARKVORY_ROLE": "api", **common, **read_env_file(env / "host-a-writer.env.example")},
        "worker": {**common, **read_env_file(env / "host-a-worker.env.example")},
        "gateway1": {"ARKVORY_ROLE": "reader", "ARKVORY_GATEWAY_SLOT": "1", **common,
                     **read_env_file(env / "host-b-gateway-1.env.example")},
        "gateway2": {"ARKVORY_ROLE": "reader", "ARKVORY_GATEWAY_SLOT": "2", **common,
                     **read_env_file(env / "host-c-gateway-2.env.example")},
    }


MULTI_WRITER = "10.0.0.11:8080"
MULTI_GATEWAYS = ("10.0.0.12:8080", "10.0.0.13:8080")


def test_multi_host_env_examples_build_one_installation_on_one_bucket(multi_host, tmp_path):
    from arkvory.writer.worker.startup import worker_settings

    common = multi_host["common"]
    assert not {"ARKVORY_ROLE", "ARKVORY_GATEWAY_SLOT", "ARKVORY_PORT", "ARKVORY_HOST", "ARKVORY_DATA_DIR"} & common.keys()
    assert common["ARKVORY_STORAGE_URL"].startswith("s3://") and "AWS_SECRET_ACCESS_KEY" in common
    processes = {name: settings_from(multi_host[name], tmp_path) for name in ("writer", "gateway1", "gateway2")}
    keys = tmp_path / "keys.toml"
    worker = worker_settings({**multi_host["worker"], "ARKVORY_KEYS_FILE": str(keys)})
    for settings in (*processes.values(), worker):
        assert settings.object_store is not None and settings.storage_url == common["ARKVORY_STORAGE_URL"]
    addresses = [f"{s.host}:{s.port}" for s in processes.values()]
    assert addresses == [MULTI_WRITER, *MULTI_GATEWAYS]
    assert [s.slot for s in processes.values()] == [0, 1, 2]
    assert processes["writer"].shared.slots == 3
    # No directory is shared: each host's local state is its own; the worker's is the writer's.
    data_dirs = [s.data_dir for s in processes.values()]
    assert len(set(data_dirs)) == 3 and worker.data_dir == processes["writer"].data_dir
    drop_in = read_unit(MULTI / "systemd" / "arkvory-gateway@.service.d" / "object-store.conf")["Service"]
    assert drop_in["StateDirectory"] == ["arkvory/gateway-%i"]
    assert covers(drop_in["ReadWritePaths"], str(processes["gateway1"].data_dir).replace("gateway-1", "gateway-%i"))


def test_multi_host_balancers_route_content_across_the_hosts_and_the_rest_to_the_writer():
    nginx = (MULTI / "nginx" / "arkvory.conf").read_text()
    haproxy = (MULTI / "haproxy" / "haproxy.cfg").read_text()
    expected = sorted([[MULTI_WRITER], [MULTI_WRITER, *MULTI_GATEWAYS]])
    assert sorted(_nginx_upstreams(nginx).values()) == expected
    assert sorted(_haproxy_backends(haproxy).values()) == expected
    # The same routing as the one-host files, only the addresses differ.
    strip = lambda text: [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]  # noqa: E731
    one_host = {NGINX_CONF: nginx, HAPROXY_CFG: haproxy}
    for path, text in one_host.items():
        local = path.read_text()
        for old, new in zip(("127.0.0.1:8080", "127.0.0.1:8081", "127.0.0.1:8082"), (MULTI_WRITER, *MULTI_GATEWAYS)):
            local = local.replace(old, new)
        assert strip(local) == strip(text), path.name


def test_multi_host_balancer_configurations_are_accepted(tmp_path):
    haproxy = require_tool("haproxy", apt="haproxy")
    result = subprocess.run(
        [haproxy, "-c", "-f", str(MULTI / "haproxy" / "haproxy.cfg")], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr
    nginx = require_tool("nginx", apt="nginx-light")
    wrapper = nginx_wrapper(tmp_path, MULTI / "nginx" / "arkvory.conf")
    result = subprocess.run(
        [nginx, "-t", "-p", str(tmp_path), "-c", str(wrapper)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr


# -- SeaweedFS in production (deploy/multi-host/seaweedfs/) --------------------------------------

SEAWEEDFS = MULTI / "seaweedfs"


def test_the_seaweedfs_unit_guards_the_store_as_the_dev_store_is_guarded(tmp_path):
    """The same guards as `arkvory dev --storage s3` (shared/cli/seaweedfs.py): only S3 serves a
    blob, no bucket appears by itself, no browser origin; SIGKILL after a bounded SIGTERM wait
    (weed may never finish its own shutdown); and systemd accepts the unit."""
    from arkvory.shared.cli import seaweedfs

    unit = read_unit(SEAWEEDFS / "seaweedfs.service")["Service"]
    command = " ".join(unit["ExecStart"]).split()
    for flag in ("-disableHttp", "-s3.autoCreateBucket=false", f"-s3.allowedOrigins={seaweedfs._NO_ORIGIN}",
                 "-master.telemetry=false", "-logtostderr"):
        assert flag in command, flag
    assert unit["SendSIGKILL"] == ["yes"] and unit["TimeoutStopSec"] == ["15s"]
    assert unit["WorkingDirectory"] == ["/etc/seaweedfs"]  # where weed finds security.toml
    security = tomllib.loads((SEAWEEDFS / "security.toml.example").read_text())
    assert {"jwt", "cors", "grpc", "access"} <= security.keys()
    assert {"signing"} <= security["jwt"].keys() and "read" in security["jwt"]["signing"]
    assert {"master", "volume", "filer", "s3", "client"} <= security["grpc"].keys()
    identities = json.loads((SEAWEEDFS / "s3.json.example").read_text())["identities"]
    assert [sorted(i["actions"]) for i in identities] == [["List", "Read", "Tagging", "Write"]]
    analyze = require_tool("systemd-analyze", apt="systemd", why="the checks above still ran")
    weed = seaweedfs.find_weed() or pathlib.Path(shutil.which("true") or "/bin/true")
    (tmp_path / "seaweedfs.service").write_text(
        (SEAWEEDFS / "seaweedfs.service").read_text().replace("/usr/local/bin/weed", str(weed))
    )
    result = subprocess.run([analyze, "verify", "--man=no", "seaweedfs.service"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=30)
    complaints = [line for line in result.stderr.splitlines() if str(tmp_path) in line]
    assert result.returncode == 0 and not complaints, result.stderr
