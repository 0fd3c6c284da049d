"""PostgreSQL failover, proven (issue 24 item 7, SPEC §11): a primary with a synchronous streaming
standby (tests/pgreplica.py: pg_basebackup -R, synchronous_standby_names, pg_ctl promote), one
multi-host ARKVORY_DATABASE_URL with target_session_attrs=read-write, a writer, a gateway and a
worker under downloads and uploads, and a supervisor that restarts what exits as the systemd
units do (Restart=on-failure, RestartSec=1, RestartPreventExitStatus=2 3 78).

The primary goes the hard way: first its standby stops receiving WAL (a synchronous commit then
waits, and so do the lease renewals), then its host vanishes (connections hang, none is
refused). The standby is promoted once the processes have lost their leases, as a failover
manager would after its own detection delay. Then:

- every upload acknowledged before the primary died is there, metadata and bytes;
- every process serves again without a human: the writer and the gateway exited (75, then 69
  while no primary answered) and came back, the worker took its lock again by itself;
- no slot was held by two processes at once: each incarnation's generation is new, its trust
  ended before the next one of its slot started, and the promoted standby's reservation of each
  slot outlasted the trust its holder had counted on (a renewal lost with an asynchronous
  standby breaks exactly this: docs/operations.md, "PostgreSQL, highly available");
- the budget held, from the processes' own counters of granted bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import time
import uuid
from collections.abc import Callable

import httpx
import pytest

from .harness import ADMIN_TOKEN, ArkvoryProcess, Cluster, db_fetch, eventually, free_port
from .pgreplica import ReplicatedPostgres, beside
from .worker_harness import WorkerProc

pytestmark = [pytest.mark.timeout(240), pytest.mark.soak]

KiB = 1024
SHARE = 256 * KiB  # bytes/s of each of the 2 slots
TOTAL = 2 * SHARE
BURST = SHARE // 10
RESTART_SEC = 1.0
RESTART_PREVENTED = (0, 2, 3, 78)  # as the units: 0 is a planned stop
SAMPLE_EVERY_S = 0.2
TRUST_S = 8.0  # the lease's local trust after a renewal was sent (SPEC §4)
BUDGET_WINDOW_S = 5.0


# -- the supervisor ----------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)  # one per process: hashed by identity
class Incarnation:
    unit: str
    number: int
    process: ArkvoryProcess | WorkerProc
    started: float  # monotonic, when spawned
    exited: float | None = None
    status: int | None = None


class Supervisor:
    """Restarts a unit's process RESTART_SEC after it exits, unless the exit is one the units
    do not restart; keeps every incarnation for the checks."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.starters: dict[str, Callable[[str], ArkvoryProcess | WorkerProc]] = {}
        self.incarnations: dict[str, list[Incarnation]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)

    def add(self, unit: str, start: Callable[[str], ArkvoryProcess | WorkerProc]) -> None:
        self.starters[unit] = start
        self.incarnations[unit] = []
        self._spawn(unit)

    def current(self, unit: str) -> Incarnation:
        return self.incarnations[unit][-1]

    def exits(self, unit: str) -> list[int]:
        return [i.status for i in self.incarnations[unit] if i.status is not None]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _spawn(self, unit: str) -> None:
        number = len(self.incarnations[unit])
        process = self.starters[unit](f"{unit}-{number}")
        self.cluster.processes.append(process)  # closed with the cluster
        self.incarnations[unit].append(Incarnation(unit, number, process, time.monotonic()))

    def _watch(self) -> None:
        restart_at: dict[str, float] = {}
        while not self._stop.wait(0.05):
            now = time.monotonic()
            for unit in self.starters:
                incarnation = self.current(unit)
                if incarnation.exited is None and (status := incarnation.process.proc.poll()) is not None:
                    incarnation.exited, incarnation.status = now, status
                    if status not in RESTART_PREVENTED:
                        restart_at[unit] = now + RESTART_SEC
                if unit in restart_at and now >= restart_at[unit]:
                    del restart_at[unit]
                    self._spawn(unit)


# -- what the clients and the monitor see -------------------------------------------------------


@dataclasses.dataclass
class Sample:
    """One readiness answer of a writer or gateway incarnation."""

    incarnation: Incarnation
    monotonic: float  # when the answer arrived: trust left is counted from here (an overestimate)
    wall: float
    slot: int
    active: bool
    generation: int | None
    lease_seconds: float
    granted_bytes: int


class Load:
    """Downloads from the writer and the gateway, uploads to the writer, and the monitor that
    samples every incarnation's readiness, until `stop()`."""

    def __init__(self, supervisor: Supervisor, content: dict[str, str], data: bytes) -> None:
        self.supervisor = supervisor
        self.content = content  # unit -> content path
        self.data = data
        self.samples: list[Sample] = []
        self.downloads: list[tuple[str, float]] = []  # (unit, monotonic) of each complete, correct one
        self.wrong_bodies = 0
        self.uploads: list[dict] = []  # acknowledged (201): id, sha256, body, acknowledged (monotonic)
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._download, args=(unit,), daemon=True)
            for unit in content for _ in range(3)
        ] + [threading.Thread(target=self._upload, daemon=True), threading.Thread(target=self._monitor, daemon=True)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _url(self, unit: str) -> str:
        return self.supervisor.current(unit).process.url

    def _download(self, unit: str) -> None:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        while not self._stop.is_set():
            try:
                answer = httpx.get(self._url(unit) + self.content[unit], headers=headers, timeout=20)
            except httpx.HTTPError:
                self._stop.wait(0.3)
                continue
            if answer.status_code != 200:
                self._stop.wait(0.3)
                continue
            if answer.content == self.data:
                self.downloads.append((unit, time.monotonic()))
            else:
                self.wrong_bodies += 1

    def _upload(self) -> None:
        number = 0
        while not self._stop.is_set():
            number += 1
            body = os.urandom(8 * KiB) + number.to_bytes(4, "big")
            try:
                answer = httpx.post(
                    self._url("writer") + "/api/v1/repositories/failover/artifacts",
                    params={"name": f"upload-{number}.bin"}, content=body, timeout=10,
                    headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Idempotency-Key": uuid.uuid4().hex},
                )
            except httpx.HTTPError:
                answer = None
            if answer is not None and answer.status_code == 201:
                self.uploads.append({**answer.json(), "body": body, "acknowledged": time.monotonic()})
            self._stop.wait(0.2)

    def _monitor(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY_S):
            for unit in ("writer", "gateway"):
                incarnation = self.supervisor.current(unit)
                try:
                    with incarnation.process.client(timeout=1) as client:
                        body = client.get("/health/ready").json()
                except (httpx.HTTPError, ValueError):
                    continue
                shared = body.get("sharedDownloads")
                if not shared:
                    continue
                self.samples.append(Sample(
                    incarnation, time.monotonic(), time.time(), shared["slot"], shared["active"],
                    shared["generation"], shared["leaseSeconds"],
                    body["transfers"]["downloads"]["bandwidth"]["grantedBytes"],
                ))


# -- the scenario -------------------------------------------------------------------------------


@pytest.fixture
def synchronous_pair(postgres):
    pair = ReplicatedPostgres.start(beside(postgres))
    try:
        pair.make_synchronous()
        yield pair
    finally:
        pair.destroy()


def test_a_promoted_synchronous_standby_loses_no_upload_and_no_reservation(synchronous_pair, tmp_path):
    pair = synchronous_pair
    cluster = Cluster(pair.failover_url(), tmp_path)
    supervisor = Supervisor(cluster)
    try:
        run_the_failover(pair, cluster, supervisor)
    finally:
        supervisor.stop()
        cluster.close()


def run_the_failover(pair: ReplicatedPostgres, cluster: Cluster, supervisor: Supervisor) -> None:
    shared = cluster.shared_env(slots=2, total=TOTAL)
    writer_env = cluster.base_env(ARKVORY_ROLE="api", ARKVORY_GATEWAY_SLOT="0", **shared)
    gateway_env = cluster.base_env(ARKVORY_ROLE="reader", ARKVORY_GATEWAY_SLOT="1", **shared)
    worker_env = cluster.base_env(ARKVORY_WORKER_PORT=str(free_port()))
    supervisor.add("writer", lambda name: ArkvoryProcess(name, writer_env, cluster.workdir))
    supervisor.current("writer").process.wait_ready(60)
    supervisor.add("gateway", lambda name: ArkvoryProcess(name, gateway_env, cluster.workdir))
    supervisor.add("worker", lambda name: WorkerProc(name, worker_env, cluster.workdir, real=True))
    supervisor.start()
    supervisor.current("gateway").process.wait_ready(60)
    supervisor.current("worker").process.wait_active(60)

    data = os.urandom(128 * KiB)  # half a second of a share
    with supervisor.current("writer").process.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "failover"}).status_code == 201
        artifact = client.post("/api/v1/repositories/failover/artifacts", params={"name": "d.bin"}, content=data)
        assert artifact.status_code == 201, artifact.text
    path = f"/api/v1/repositories/failover/artifacts/{artifact.json()['id']}/content"
    load = Load(supervisor, {"writer": path, "gateway": path}, data)
    load.start()
    try:
        eventually(lambda: len(load.uploads) >= 3 and len(load.downloads) >= 4, "uploads and downloads under way", 30)
        time.sleep(BUDGET_WINDOW_S + 1)  # the load runs a while on the primary: a window to measure

        # The primary's network fails: first the standby stops receiving its WAL (every
        # synchronous commit, lease renewals included, now waits), then its host vanishes.
        pair.replication_link.stall()
        time.sleep(3.0)  # nothing commits meanwhile; the processes' trust runs down
        pair.primary_address.stall()
        pair.kill_primary()
        died = time.monotonic()
        acknowledged_before = [u for u in load.uploads if u["acknowledged"] < died]

        # A failover manager notices after its own delay; here, once both leases are lost and
        # both processes, restarted, found no primary (exit 69).
        eventually(
            lambda: all(
                supervisor.exits(unit)[:1] == [75] and 69 in supervisor.exits(unit) for unit in ("writer", "gateway")
            ),
            "the writer and the gateway exited after losing their leases, then found no primary", 60,
        )
        reservations = reservations_on_the_standby(pair)
        pair.promote()
        promoted = time.monotonic()

        for unit in ("writer", "gateway"):  # whichever incarnation the supervisor runs by then
            eventually(lambda: supervisor.current(unit).process.status() == (200, "ready"), f"the {unit} back", 60)
        eventually(lambda: supervisor.current("worker").process.status() == "active", "the worker active again", 60)
        back = time.monotonic() - promoted
        eventually(
            lambda: {unit for unit, at in load.downloads if at > promoted} == {"writer", "gateway"}
            and any(u["acknowledged"] > promoted for u in load.uploads),
            "downloads from both and an upload after the promotion", 30,
        )
        time.sleep(BUDGET_WINDOW_S + 1)  # and on the new one
    finally:
        load.stop()

    check_uploads(supervisor, acknowledged_before, load.uploads)
    check_every_process_came_back(supervisor, pair)
    margins = check_no_slot_held_twice(load.samples, supervisor, reservations)
    worst = check_the_budget(load.samples)
    assert load.wrong_bodies == 0
    print(
        f"failover: {len(acknowledged_before)} of {len(load.uploads)} uploads acknowledged before the primary"
        f" died, all there; promoted {promoted - died:.1f} s after; all three serving again"
        f" {back:.1f} s after that; exits {({u: supervisor.exits(u) for u in supervisor.incarnations})};"
        f" reservation beyond trust by slot {margins}; worst {BUDGET_WINDOW_S:.0f}-s stretch {worst:.3f} of the budget"
    )


def reservations_on_the_standby(pair: ReplicatedPostgres) -> dict[int, tuple[int, float]]:
    """slot -> (generation, expiry as a Unix time) of the rows the standby has replayed: what the
    promoted server will hold (read on the standby before promotion, so that no restarted
    process can have taken a slot again meanwhile)."""
    url = pair.standby_superuser_url
    eventually(
        lambda: db_fetch(url, "SELECT pg_last_wal_receive_lsn() <= pg_last_wal_replay_lsn() AS done")[0]["done"],
        "the standby having replayed what it received", 10,
    )
    rows = db_fetch(
        pair.app_url(pair.standby_port),
        "SELECT slot, generation, extract(epoch FROM expires_at)::float8 AS expires FROM arkvory_gateway_leases",
    )
    return {row["slot"]: (row["generation"], row["expires"]) for row in rows}


# -- the checks ---------------------------------------------------------------------------------


def check_uploads(supervisor: Supervisor, acknowledged_before: list[dict], acknowledged: list[dict]) -> None:
    assert len(acknowledged_before) >= 3, acknowledged_before
    with supervisor.current("writer").process.client() as client:
        for upload in acknowledged:
            meta = client.get(f"/api/v1/repositories/failover/artifacts/{upload['id']}")
            assert meta.status_code == 200, (upload["name"], meta.text)
            assert meta.json()["sha256"] == hashlib.sha256(upload["body"]).hexdigest()
            body = client.get(f"/api/v1/repositories/failover/artifacts/{upload['id']}/content")
            assert body.status_code == 200 and body.content == upload["body"], upload["name"]


def check_every_process_came_back(supervisor: Supervisor, pair: ReplicatedPostgres) -> None:
    for unit in ("writer", "gateway"):
        exits = supervisor.exits(unit)
        assert exits[:1] == [75] and set(exits[1:]) == {69}, f"{unit} exited {exits}"  # lease lost, then no primary
    worker = supervisor.current("worker").process
    assert supervisor.exits("worker") == [], worker.stderr  # it stands by until a primary answers
    assert worker.stderr.count("no longer the active worker") == 1, worker.stderr
    assert worker.stderr.count("worker lock taken") == 2, worker.stderr
    writer = supervisor.current("writer").process
    with writer.client() as client:
        task = client.post("/api/v1/tasks", json={"kind": "verify"})
        assert task.status_code == 202, task.text
        done = eventually(
            lambda: (status := client.get(f"/api/v1/tasks/{task.json()['id']}").json()["status"])
            in ("completed", "failed") and status,
            "the verify task done by the worker", 60,
        )
    assert done == "completed"
    for incarnations in supervisor.incarnations.values():
        for incarnation in incarnations:
            log = incarnation.process.stderr
            assert pair.app_password not in log, incarnation.process.name
            assert "Traceback" not in log, f"{incarnation.process.name}:\n{log}"


def check_no_slot_held_twice(samples: list[Sample], supervisor: Supervisor, reservations: dict) -> dict[int, float]:
    """Returns by slot how long the promoted standby's reservation outlasted its holder's trust."""
    margins = {}
    by_slot: dict[int, dict[Incarnation, list[Sample]]] = {}
    for sample in samples:
        if sample.active:
            by_slot.setdefault(sample.slot, {}).setdefault(sample.incarnation, []).append(sample)
    assert set(by_slot) == {0, 1}, by_slot.keys()
    for slot, holders in by_slot.items():
        ordered = sorted(holders, key=lambda incarnation: incarnation.started)
        generations = [{s.generation for s in holders[i]} for i in ordered]
        assert all(len(g) == 1 for g in generations), (slot, generations)
        generations = [g.pop() for g in generations]
        assert generations == sorted(set(generations)), (slot, generations)  # each acquisition new
        for before, after in zip(ordered, ordered[1:]):
            trusted_until = min(max(s.monotonic + s.lease_seconds for s in holders[before]), before.exited)
            assert trusted_until <= after.started, (slot, before.number, after.number)
        # The holder at the failover, and what the promoted standby reserves for it.
        at_failover = [i for i in ordered if i.number == 0]
        assert at_failover, (slot, [i.number for i in ordered])
        generation, expires = reservations[slot]
        held = holders[at_failover[0]]
        assert generation == held[0].generation, (slot, generation, held[0].generation)
        trusted_until_wall = max(s.wall + s.lease_seconds for s in held)
        assert expires >= trusted_until_wall, (
            f"slot {slot}: the promoted standby reserves it until {expires:.2f}, but its holder"
            f" trusted it until {trusted_until_wall:.2f}: a renewal was lost"
        )
        margins[slot] = round(expires - trusted_until_wall, 2)
    return margins


def check_the_budget(samples: list[Sample], window: float = BUDGET_WINDOW_S) -> float:
    """Bytes granted by every incarnation together, from their own counters (sampled every
    SAMPLE_EVERY_S or so): no stretch of about `window` seconds got more than the total rate
    allows, plus a burst for each incarnation (each starts with a full bucket). Returns the
    worst stretch's share of the budget."""
    series = {}
    for sample in samples:
        series.setdefault(sample.incarnation, []).append((sample.monotonic, sample.granted_bytes))

    def counted(end: float, start: float) -> tuple[int, float]:
        """The bytes the samples show granted from `start` to `end`, and from when they may
        have been: each counter's last reading before `start` (its process's spawn if none)."""
        granted, since = 0, start
        for incarnation, points in series.items():
            at_end = [(when, value) for when, value in points if when <= end]
            if not at_end:
                continue
            at_start = [(when, value) for when, value in points if when <= start]
            begin, before = at_start[-1] if at_start else (incarnation.started, 0)
            granted += at_end[-1][1] - before
            since = min(since, begin)
        return granted, since

    first = min(points[0][0] for points in series.values())
    last = max(points[-1][0] for points in series.values())
    worst = 0.0
    end = first + window
    while end <= last:
        granted, since = counted(end, end - window)
        worst = max(worst, granted / (TOTAL * (end - since)))
        assert granted <= TOTAL * (end - since) + BURST * len(series), (
            f"{granted} bytes granted in {end - since:.2f} s, {end - first:.1f} s into the run"
        )
        end += 0.5
    assert worst > 0.5, f"the load never used the budget (worst stretch {worst:.3f} of it)"
    return worst


def test_a_promotion_within_the_trust_costs_no_restart(synchronous_pair, tmp_path):
    """A failover manager that promotes at once: the processes' renewals reach the new primary
    before their trust runs out (the host that did not answer is tried last from then on), and
    its rows are the old primary's, so each keeps its slot and serves on."""
    pair = synchronous_pair
    cluster = Cluster(pair.failover_url(), tmp_path)
    try:
        shared = cluster.shared_env(slots=2, total=TOTAL)
        writer = cluster.writer(shared).wait_ready()
        data = os.urandom(64 * KiB)
        with writer.client() as client:
            assert client.post("/api/v1/repositories", json={"name": "quick"}).status_code == 201
            created = client.post("/api/v1/repositories/quick/artifacts", params={"name": "q.bin"}, content=data)
            assert created.status_code == 201, created.text
        gateway = cluster.gateway(1, shared).wait_ready()
        generations = {p.name: lease_of(p)["generation"] for p in (writer, gateway)}

        pair.primary_address.stall()  # the primary's host vanishes...
        pair.kill_primary()
        died = time.monotonic()
        pair.promote()  # ...and its standby takes over at once
        time.sleep(max(0.0, died + TRUST_S + 1.0 - time.monotonic()))  # past what the old primary's renewals gave

        path = f"/api/v1/repositories/quick/artifacts/{created.json()['id']}/content"
        for process in (writer, gateway):
            assert process.proc.poll() is None, process.stderr
            eventually(lambda: process.status() == (200, "ready"), f"{process.name} serving", 10)
            assert lease_of(process)["generation"] == generations[process.name]  # the same tenure
            assert "lease LOST" not in process.stderr, process.stderr
            with process.client() as client:
                assert client.get(path).content == data
        with writer.client() as client:
            after = client.post("/api/v1/repositories/quick/artifacts", params={"name": "r.bin"}, content=b"after")
            assert after.status_code == 201, after.text
    finally:
        cluster.close()


def lease_of(process: ArkvoryProcess) -> dict:
    with process.client() as client:
        return client.get("/health/ready").json()["sharedDownloads"]
