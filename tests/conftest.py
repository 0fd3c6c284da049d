"""Fixtures: one real PostgreSQL server per test process, a fresh database per test, real
`arkvory serve` processes (tests/harness.py) and a TCP proxy to cut them off the database.

How the suite runs, and what a new test follows:

- **Parallel.** pyproject's addopts run the suite on pytest-xdist workers (`-n`, `--dist
  loadgroup`). Every session fixture runs once *per worker*: each worker has its own PostgreSQL
  server (its own data under its own basetemp, `popen-gwN/`), its own SeaweedFS, its own free
  ports. Nothing may assume it is alone on the machine: take ports from `harness.free_port()`,
  directories from `tmp_path`, names from `uuid`. A module whose tests share a module-scoped
  fixture (a cluster started once for the module) builds it on `module_tmp_path`: its tests
  then all go to one worker (an `xdist_group` added below), so the fixture starts once. Any
  other grouping: `pytest.mark.xdist_group("name")`. `-n 0` runs in one process.
- **Tiers.** The README's command runs the default tier, which still proves the real timings
  (the 10 s reservation, 2 s renewal, 8 s trust, 15 s restart wait) with real processes.
  `@pytest.mark.soak` marks the long cases (a fuzz loop, fault scenarios and the real browser
  that take 10 s or more each, which kept the default tier above 10 minutes): skipped by
  default, run by `.ci/run` (`pytest -m soak`). `@pytest.mark.slow` only says a test takes seconds of real time.
- **Waiting.** Never a fixed sleep for something to happen: wait for the condition with a
  bound (`harness.eventually`, `ArkvoryProcess.wait_ready`, `worker_harness.wait_for`), so a
  loaded machine costs time, not a failure. A sleep is right only for "nothing happens during
  this long". Shorten a timing only through a setting an operator has too (e.g.
  ARKVORY_RECEIVE_TIMEOUT_SECONDS), never through a test-only code path.
- **Raw HTTP.** A test that reads an answer off a socket reads the whole of it
  (`rawhttp.read_response`): head and body may come in separate reads.
- **System tools.** A test that needs one (haproxy, nginx, promtool, systemd-analyze, strace,
  chromium, weed, ...) gets it with `tools.require_tool(name, apt=package)`, which skips with the
  install command when it is missing; `.ci/run` installs every one so CI runs those tests.
- **Bytecode.** With PYTHONDONTWRITEBYTECODE set (and no PYTHONPYCACHEPREFIX), every `arkvory`
  process a test starts would compile the package from source again (~0.1 s of CPU each, ~900
  processes a run): the controller points PYTHONPYCACHEPREFIX of every process of the run at one
  directory under the run's basetemp instead, so the tree still gets no `__pycache__`, and
  deletes it at the end (`pytest_configure` below).
- **Cleanup.** A run leaves nothing behind. `tmp_path` of a passing test is deleted at once
  (`tmp_path_retention_policy = "failed"`); a module-scoped fixture takes its directory from
  `module_tmp_path` (deleted at the module's end unless one of its tests failed), never from
  `tmp_path_factory.mktemp`; a server a test starts is `destroy()`ed, not only stopped; as root,
  PostgreSQL data lives on localpg's shelf (/tmp/arkvory-postgres/homes) and goes with it.
  After a passing run, `pytest_sessionfinish` below fails the run, naming them, if files are
  left under the run's basetemp or on the shelf.
- **The test PostgreSQL's data** is on tmpfs (/dev/shm) when there is room: creating a database
  per test costs ~13× less CPU there than on this machine's disk (`_memory_backed_dir`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pathlib
import shutil
import socket
import tempfile
import uuid

import pytest

from arkvory.shared.cli.localpg import remove_orphaned_homes, start_local_postgres

from .harness import Cluster, db_execute
# The object-store fixtures, for every module from here: imported into a test module, a session
# fixture is that module's own (one more SeaweedFS per module, running until the session ends).
from .s3cluster import s3_cluster  # noqa: F401  (pytest fixtures)
from .s3store import s3_bucket, seaweedfs  # noqa: F401
from .tcpproxy import TcpProxy


def _one_tls_context_for_every_http_client() -> None:
    """httpx builds a TLS context for every Client it makes, even one that only ever speaks
    http:// (`httpx.get` makes a Client per call): parsing the CA bundle costs ~20 ms of CPU
    each time, and the tests make thousands of them (every poll of /health/status): ~110 s
    of CPU a run. The default context is made once per CA setting here and shared: a
    context is safe to share between clients, and any other `verify` still gets its own."""
    transports = importlib.import_module("httpx._transports.default")
    make = getattr(transports, "create_ssl_context", None)
    if make is None:  # a later httpx: only the speed-up is lost
        return
    made: dict[tuple, object] = {}

    def create_ssl_context(verify=True, cert=None, trust_env=True):
        if verify is not True or cert is not None:
            return make(verify=verify, cert=cert, trust_env=trust_env)
        ca = (trust_env, os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
        if ca not in made:
            made[ca] = make(verify=verify, cert=cert, trust_env=trust_env)
        return made[ca]

    transports.create_ssl_context = create_ssl_context


_one_tls_context_for_every_http_client()


@pytest.fixture(scope="session", autouse=True)
def _no_orphaned_postgres_data():
    yield
    remove_orphaned_homes()  # after every test's tmp_path teardown


@pytest.fixture(scope="session")
def postgres(tmp_path_factory, _no_orphaned_postgres_data):
    with _memory_backed_dir() as base_dir:
        server = start_local_postgres(base_dir or tmp_path_factory.mktemp("pg"), fsync=False)
        yield server
        server.destroy()


# A run creates ~900 databases of ~300 files each. On an ext4 without a journal (this machine's
# root) every new inode first scans for recently deleted ones: CREATE DATABASE costs ~0.4 s of
# CPU there against ~0.03 s on tmpfs, a third of the suite's CPU. The test server's data is
# thrown away at the end anyway; the product's own PostgreSQL (`arkvory dev`) stays on disk.
_MEMORY_FS = pathlib.Path("/dev/shm")
_MEMORY_DIR_PREFIX = "arkvory-test-pg-"
_MEMORY_NEEDED = 2 << 30  # the server's data, a few live databases and WAL; Docker's /dev/shm is 64 MiB


@contextlib.contextmanager
def _memory_backed_dir():
    """A directory on tmpfs for the test server's data (None when there is no roomy tmpfs),
    deleted at the end; directories left by an earlier run that was killed are deleted first."""
    try:
        usage = shutil.disk_usage(_MEMORY_FS)
    except OSError:
        yield None
        return
    if usage.free < _MEMORY_NEEDED:
        yield None
        return
    for stale in _MEMORY_FS.glob(f"{_MEMORY_DIR_PREFIX}*"):
        pid = stale.name.removeprefix(_MEMORY_DIR_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not _process_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    path = pathlib.Path(tempfile.mkdtemp(prefix=f"{_MEMORY_DIR_PREFIX}{os.getpid()}-", dir=_MEMORY_FS))
    path.chmod(0o755)  # as root, the server's user must reach its home inside (localpg)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.fixture(scope="module")
def module_tmp_path(request, tmp_path_factory) -> pathlib.Path:
    """A directory for a module-scoped fixture: deleted at the module's end unless one of its
    tests failed (then kept, like a failed test's tmp_path, for a look at its logs)."""
    failed_before = request.session.testsfailed
    path = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
    yield path
    if request.session.testsfailed == failed_before:
        shutil.rmtree(path, ignore_errors=True)


def _fresh_database(postgres):
    """A new database, dropped after its user (after its processes, which depend on it): ~8 MB
    copied per test add up to gigabytes of a worker's server data otherwise, written to disk
    during the run and deleted at its end."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield postgres.create_database(name)
    # FORCE ends the sessions of a process a test left running or stopped (SIGSTOP).
    db_execute(postgres.url, f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture
def database_url(postgres):
    yield from _fresh_database(postgres)


@pytest.fixture
def cluster(database_url, tmp_path):
    group = Cluster(database_url, tmp_path)
    yield group
    group.close()


@pytest.fixture(scope="module")
def module_database_url(postgres, module_tmp_path):
    yield from _fresh_database(postgres)


@pytest.fixture(scope="module")
def module_cluster(module_database_url, module_tmp_path):
    """One database and storage for a module's tests (on one worker, as it uses module_tmp_path):
    processes started here are shared, so a test using them changes nothing another test looks
    at (its own repository names, no counts over the whole database); a test that needs a
    fresh installation takes `cluster`."""
    group = Cluster(module_database_url, module_tmp_path)
    yield group
    group.close()


@pytest.fixture
def refused_url():
    """Makes URLs where a connection is refused for the whole test: each port is held by a
    bound socket that never listens. A port `free_port()` only found free can be taken a moment
    later by another worker's server, which then answers (and counts) the requests meant to
    find nobody."""
    held: list[socket.socket] = []

    def take() -> str:
        sock = socket.socket()
        held.append(sock)
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    yield take
    for sock in held:
        sock.close()


@pytest.fixture
def db_proxy(database_url):
    proxy = TcpProxy.for_url(database_url)
    proxy.start()
    yield proxy
    proxy.stop()


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A module whose tests share a module-scoped fixture built on `module_tmp_path` (a cluster
    started once for the module) runs on one xdist worker: elsewhere it would start again."""
    for item in items:
        if "module_tmp_path" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__.rsplit(".", 1)[-1]))


# -- bytecode compiled once per run ------------------------------------------------------------------

_BYTECODE = pytest.StashKey[tuple[pathlib.Path, str]]()  # the cache, PYTHONDONTWRITEBYTECODE


@pytest.hookimpl(trylast=True)  # after the tmpdir plugin has made config._tmp_path_factory
def pytest_configure(config: pytest.Config) -> None:
    """With PYTHONDONTWRITEBYTECODE, the run's processes (xdist workers, `arkvory` servers, the
    CLI) share one bytecode cache under the basetemp instead of compiling at every start. Set
    here, in the controller, before the workers start: they and their children inherit it."""
    if _is_xdist_worker(config) or "PYTHONPYCACHEPREFIX" in os.environ:
        return
    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return  # Python caches bytecode in __pycache__ as usual
    cache = config._tmp_path_factory.getbasetemp() / "bytecode"  # type: ignore[attr-defined]
    cache.mkdir(exist_ok=True)
    config.stash[_BYTECODE] = (cache, os.environ.pop("PYTHONDONTWRITEBYTECODE"))
    os.environ["PYTHONPYCACHEPREFIX"] = str(cache)


def _drop_bytecode_cache(config: pytest.Config) -> None:
    if _BYTECODE not in config.stash:
        return
    cache, dont_write = config.stash[_BYTECODE]
    del config.stash[_BYTECODE]
    os.environ.pop("PYTHONPYCACHEPREFIX", None)
    os.environ["PYTHONDONTWRITEBYTECODE"] = dont_write
    shutil.rmtree(cache, ignore_errors=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    _drop_bytecode_cache(config)  # the workers have ended; a failed or interrupted run too


# -- a run leaves nothing behind ------------------------------------------------------------------

_LEFT_BEHIND = pytest.StashKey[list[str]]()
_SHOWN = 20


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)  # before pytest's own sessionfinish deletes the basetemp
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After a passing run (in the controller, once every worker is done): no file may be left
    under the run's basetemp, nor PostgreSQL data of this run on localpg's shelf."""
    config = session.config
    if _is_xdist_worker(config) or exitstatus != 0 or config.option.basetemp:
        return  # a failed run keeps its failures' directories on purpose; --basetemp is the user's
    factory = config._tmp_path_factory  # type: ignore[attr-defined]
    if factory._basetemp is None:  # no test asked for a directory
        return
    basetemp = factory.getbasetemp().resolve()
    bytecode = config.stash[_BYTECODE][0].resolve() if _BYTECODE in config.stash else None
    left = []
    for root, dirs, files in os.walk(basetemp):
        # The run's bytecode cache: ours, deleted at pytest_unconfigure, once the xdist workers
        # (which may still import a module while they stop) have ended.
        dirs[:] = [name for name in dirs if pathlib.Path(root, name) != bytecode]
        left += [os.path.join(root, name) for name in files]
    # pytest's own: its lock, and the `<name>current` links to numbered directories it made
    # (a passing test's directory is deleted, its link left dangling).
    left = [
        path for path in left
        if path != str(basetemp / ".lock") and not (os.path.islink(path) and not os.path.exists(path))
    ]
    homes = pathlib.Path(tempfile.gettempdir()) / "arkvory-postgres" / "homes"
    if homes.is_dir():
        for home in homes.iterdir():
            try:
                origin = (home / "origin").read_text()
            except OSError:
                continue
            if origin == str(basetemp) or origin.startswith(str(basetemp) + os.sep):
                left.append(f"{home} (PostgreSQL data of {origin})")
    if left:
        config.stash[_LEFT_BEHIND] = left
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    left = config.stash.get(_LEFT_BEHIND, None)
    if not left:
        return
    terminalreporter.section("files left behind by a passing run", sep="!", red=True, bold=True)
    for path in left[:_SHOWN]:
        terminalreporter.write_line(path)
    if len(left) > _SHOWN:
        terminalreporter.write_line(f"... and {len(left) - _SHOWN} more")
    terminalreporter.write_line(
        "A test or fixture that makes files deletes them (tests/conftest.py, 'Cleanup'); this run"
        " exits 1 for it.",
        red=True,
    )
