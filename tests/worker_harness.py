"""Real `arkvory worker` processes for the tests, and tasks made straight in the database.

`start_worker(cluster)` runs `python -m tests.worker_entry worker`: the real command, with the
test kinds of tests/worker_kinds.py registered next to cleanup and verify (`real=True` runs
`python -m arkvory.shared.cli.main worker` itself). Tasks are inserted with the task store, as the
API does, so the worker is woken by the same notification.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
import httpx

from arkvory.shared import db
from arkvory.writer.tasks import store

from .harness import ADMIN_TOKEN, ROOT, Cluster, free_port, listens_itself


class WorkerProc:
    def __init__(self, name: str, env: dict[str, str], workdir, *, real: bool = False) -> None:
        self.name = name
        self.env = env
        self.port = int(env["ARKVORY_WORKER_PORT"])
        self.url = f"http://127.0.0.1:{self.port}"
        self.stderr_path = workdir / f"{name}-{self.port}.stderr"
        self._stderr = open(self.stderr_path, "wb")
        module = "arkvory.shared.cli.main" if real else "tests.worker_entry"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, "worker"],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=self._stderr,
        )

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def get(self, path: str, token: str | None = ADMIN_TOKEN) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(f"{self.url}{path}", headers=headers, timeout=5)

    def status(self) -> str | None:
        try:
            return httpx.get(f"{self.url}/health/status", timeout=2).json()["status"]
        except (httpx.HTTPError, ValueError, KeyError):
            return None

    def wait_status(self, wanted: str, timeout: float = 30.0) -> WorkerProc:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited {self.proc.returncode} before {wanted}:\n{self.stderr}")
            if self.status() == wanted and listens_itself(self.proc.pid, self.port):
                return self
            time.sleep(0.05)
        raise AssertionError(f"{self.name} not {wanted} after {timeout} s (is {self.status()}):\n{self.stderr}")

    def wait_active(self, timeout: float = 30.0) -> WorkerProc:
        return self.wait_status("active", timeout)

    def wait_exit(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout} s:\n{self.stderr}") from None

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # SIGKILL works on a stopped process too
        self.proc.wait(timeout=10)

    def close(self) -> None:
        self.kill()
        self._stderr.close()


def freeze_between_transactions(worker: WorkerProc, database_url: str, timeout: float = 30.0) -> None:
    """SIGSTOP `worker` at a moment when no session of the database is inside a transaction.

    Frozen inside one (a checkpoint of a running task), it would keep that row locked, and the
    test's own write to the row would wait for ever. So: stop it, let a statement under way end,
    and if a session still holds a transaction open, let it run a moment and try again. (A
    writer's short transactions seen here cost one more try, nothing else.)"""
    deadline = time.monotonic() + timeout
    while True:
        worker.signal(signal.SIGSTOP)
        time.sleep(0.1)
        if not _run(database_url, _sessions_in_a_transaction):
            return
        worker.signal(signal.SIGCONT)
        assert time.monotonic() < deadline, f"{worker.name} was always inside a transaction"
        time.sleep(0.05)


async def _sessions_in_a_transaction(conn: asyncpg.Connection) -> int:
    return await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND xact_start IS NOT NULL"
    )


def start_worker(cluster: Cluster, name: str = "worker", *, real: bool = False, **env: str) -> WorkerProc:
    env.setdefault("ARKVORY_WORKER_PORT", str(free_port()))
    process = WorkerProc(name, cluster.base_env(**env), cluster.workdir, real=real)
    cluster.processes.append(process)  # type: ignore[arg-type]  (closed with the cluster)
    return process


# -- tasks in the database ------------------------------------------------------------------


def _run(database_url: str, work: Callable[[asyncpg.Connection], Any]) -> Any:
    async def go():
        conn = await asyncpg.connect(database_url)
        try:
            return await work(conn)
        finally:
            await conn.close()

    return asyncio.run(go())


def dispatch(
    database_url: str,
    kind: str,
    params: dict | None = None,
    *,
    on_restart: str = "retry",
    budget: dict | None = None,
    max_attempts: int = store.DEFAULT_MAX_ATTEMPTS,
) -> uuid.UUID:
    """A queued task, committed with its `task.queued` event (which wakes the worker)."""

    async def work(conn):
        async with conn.transaction():
            task = await insert_test_task(conn, kind, params, on_restart, budget, max_attempts)
        return task["id"]

    return _run(database_url, work)


async def insert_test_task(
    conn: asyncpg.Connection,
    kind: str,
    params: dict | None = None,
    on_restart: str = "retry",
    budget: dict | None = None,
    max_attempts: int = store.DEFAULT_MAX_ATTEMPTS,
) -> dict:
    """A queued task in the caller's transaction (as the API inserts one)."""
    return await store.insert_task(
        conn, kind=kind, params=params or {}, on_restart=on_restart, definition_version=None,
        definition_hash=uuid.uuid4().hex * 2, budget=budget or {}, idempotency_key=None,
        created_by="test", max_attempts=max_attempts,
    )


def transition(database_url: str, task_id: uuid.UUID, allowed_from, to: str, event: str, **fields) -> dict | None:
    return _run(
        database_url,
        lambda conn: store.transition(conn, task_id, allowed_from=allowed_from, to=to, event=event, fields=fields),
    )


def task(database_url: str, task_id: uuid.UUID) -> dict:
    return _run(database_url, lambda conn: store.fetch_task(conn, task_id))


def events(database_url: str, task_id: uuid.UUID) -> list[dict]:
    return _run(database_url, lambda conn: store.fetch_events(conn, task_id))


def event_types(database_url: str, task_id: uuid.UUID) -> list[str]:
    return [e["type"] for e in events(database_url, task_id)]


def wait_for(check: Callable[[], Any], what: str, timeout: float = 30.0, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout} s")
        time.sleep(every)


def wait_task(database_url: str, task_id: uuid.UUID, statuses, timeout: float = 30.0) -> dict:
    statuses = (statuses,) if isinstance(statuses, str) else tuple(statuses)
    return wait_for(
        lambda: (t := task(database_url, task_id)) and t["status"] in statuses and t,
        f"task {task_id} in {statuses}",
        timeout,
    )


def wait_checkpoint(database_url: str, task_id: uuid.UUID, at_least: int, timeout: float = 30.0) -> dict:
    return wait_for(
        lambda: (t := task(database_url, task_id)) and (t["checkpoint"] or {}).get("next", 0) >= at_least and t,
        f"task {task_id} checkpointed past {at_least}",
        timeout,
    )


def steps_done(database_url: str, task_id: uuid.UUID) -> list[int]:
    """Every step the `steps` kind recorded for the task, in the order done (repeats included)."""

    async def work(conn):
        if not await conn.fetchval("SELECT to_regclass('test_worker_steps') IS NOT NULL"):
            return []
        rows = await conn.fetch("SELECT step FROM test_worker_steps WHERE task_id = $1 ORDER BY n", task_id)
        return [r["step"] for r in rows]

    return _run(database_url, work)


def open_gate(database_url: str, task_id: uuid.UUID) -> None:
    """Let a `steps` task held at its `hold_at` step go on (tests/worker_kinds.py)."""
    _run(database_url, lambda conn: conn.execute("INSERT INTO test_worker_gates (task_id) VALUES ($1)", task_id))


def wait_held(database_url: str, task_id: uuid.UUID, step: int, timeout: float = 30.0) -> dict:
    """Until a `steps` task with `hold_at=step` waits at its gate: steps before it recorded and
    checkpointed (every step checkpoints by default). Its usage stays put from then on."""
    return wait_checkpoint(database_url, task_id, step, timeout)


def lock_backend(database_url: str) -> int | None:
    """The backend pid holding the worker lock."""
    rows = _run(
        database_url,
        lambda conn: conn.fetch(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1"
            " AND classid = ($1::bigint >> 32)::oid AND objid = ($1::bigint & 4294967295)::oid"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            db.WORKER_LOCK,
        ),
    )
    return rows[0]["pid"] if rows else None


def terminate_backend(database_url: str, pid: int) -> bool:
    return _run(database_url, lambda conn: conn.fetchval("SELECT pg_terminate_backend($1)", pid))


def as_json(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
