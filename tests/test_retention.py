"""Retention rules (issue 25 item 10) against a real PostgreSQL and a real writer: what a rule
deletes (many artifacts, ties on created_at, artifacts a package version or an asset holds),
that the preview is exactly what the next cleanup deletes, who may see and change a rule, that
a rule deletes nothing until it is enabled, the turns that share each run between repositories,
and the budget: bounded, and a crash after a turn buys none back (tests/worker_entry.py's kill
hook in a real worker).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import hashlib
import os
import signal
import uuid

import httpx
import pytest

from arkvory.writer.maintenance import retention as retention_step

from .harness import ADMIN_TOKEN, OTHER_TOKEN, READER_TOKEN, db_execute, db_fetch
from .test_accounts import make_account, session_of
from .test_cleanup import run_cleanup
from .worker_harness import dispatch, start_worker, task, wait_task

pytestmark = pytest.mark.timeout(240)

HOUR = 3600
LONG_GRACE = {"grace_seconds": 86400}  # the blobs of deleted artifacts stay: only retention is looked at


@dataclasses.dataclass(frozen=True)
class Seeded:
    id: uuid.UUID
    created_at: datetime.datetime


def repository(writer, name: str) -> uuid.UUID:
    with writer.client(ADMIN_TOKEN) as admin:
        made = admin.post("/api/v1/repositories", json={"name": name})
    assert made.status_code == 201, made.text
    return uuid.UUID(made.json()["id"])


def seed(database_url: str, repository_id: uuid.UUID, hours_old: list[int]) -> list[Seeded]:
    """One artifact per entry, created that many whole hours before the database's now (equal
    entries: artifacts created in the same microsecond), each with a blob row of its own."""
    now = db_fetch(database_url, "SELECT now() AS now")[0]["now"]
    made = [Seeded(uuid.uuid4(), now - datetime.timedelta(hours=h)) for h in hours_old]
    digests = [hashlib.sha256(a.id.bytes).hexdigest() for a in made]
    db_execute(database_url, "INSERT INTO arkvory_blobs (sha256, size) SELECT unnest($1::text[]), 10", digests)
    db_execute(
        database_url,
        "INSERT INTO arkvory_artifacts (id, repository_id, name, sha256, size, media_type, created_at)"
        " SELECT i, $1, 'a-' || i::text, d, 10, 'application/octet-stream', c"
        " FROM unnest($2::uuid[], $3::text[], $4::timestamptz[]) AS t(i, d, c)",
        repository_id, [a.id for a in made], digests, [a.created_at for a in made],
    )
    return made


def expected(artifacts: list[Seeded], protected: set[uuid.UUID], keep_newest: int | None,
             keep_younger_s: int | None, now: datetime.datetime) -> list[uuid.UUID]:
    """The rule as documented, in Python: beyond the newest N (by created_at, then id) AND older
    than D, never a protected one; oldest first."""
    newest_first = sorted(artifacts, key=lambda a: (a.created_at, a.id), reverse=True)
    doomed = [
        a for rank, a in enumerate(newest_first, start=1)
        if (keep_newest is None or rank > keep_newest)
        and (keep_younger_s is None or a.created_at < now - datetime.timedelta(seconds=keep_younger_s))
        and a.id not in protected
    ]
    return [a.id for a in sorted(doomed, key=lambda a: (a.created_at, a.id))]


def preview_ids(client: httpx.Client, repo: str, page_size: int, **limits) -> list[uuid.UUID]:
    """Every page of the preview (each page's cursor followed), as ids."""
    ids: list[uuid.UUID] = []
    params = {"limit": str(page_size), **{k: str(v) for k, v in limits.items()}}
    for _ in range(1000):
        answer = client.get(f"/api/v1/repositories/{repo}/retention/preview", params=params)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert len(body["items"]) <= page_size
        ids += [uuid.UUID(a["id"]) for a in body["items"]]
        if body["nextCursor"] is None:
            return ids
        params["cursor"] = body["nextCursor"]
    raise AssertionError("the preview never ended")


def left_in(database_url: str, repository_id: uuid.UUID) -> set[uuid.UUID]:
    return {r["id"] for r in db_fetch(database_url, "SELECT id FROM arkvory_artifacts WHERE repository_id = $1", repository_id)}


def put_rule(client: httpx.Client, repo: str, **body) -> dict:
    answer = client.put(f"/api/v1/repositories/{repo}/retention", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_rule_deletes_what_its_preview_lists_and_nothing_a_package_or_asset_holds(cluster):
    """900 artifacts in threes created in the same microsecond, one more every hour; the newest
    N boundary inside such a three; packages, assets and a re-pointed asset's history. For each
    combination of limits the preview, paged, is the documented rule; then the cleanup deletes
    exactly the preview's artifacts, and the next preview is empty."""
    writer = cluster.writer().wait_ready()
    url = cluster.database_url
    repo_id = repository(writer, "builds")
    other_id = repository(writer, "other")
    artifacts = seed(url, repo_id, [n // 3 for n in range(900)])  # 0..299 hours old, in threes
    untouched = seed(url, other_id, [n for n in range(50)])
    by_age = sorted(artifacts, key=lambda a: (a.created_at, a.id))
    held_by_package, held_by_asset, once_pointed = by_age[0], by_age[10], by_age[20]
    with writer.client(ADMIN_TOKEN) as admin:
        assert admin.put("/api/v1/repositories/builds/packages", json={
            "group": "g", "name": "n", "version": "1", "artifactId": str(held_by_package.id)}).status_code == 201
        assert admin.put("/api/v1/repositories/builds/assets", params={"path": "pinned"},
                         json={"artifactId": str(held_by_asset.id)}).status_code == 200
        # `latest` pointed at an old build, then at the newest: its history holds nothing back.
        for target in (once_pointed, by_age[-1]):
            assert admin.put("/api/v1/repositories/builds/assets", params={"path": "latest"},
                             json={"artifactId": str(target.id)}).status_code == 200
        protected = {held_by_package.id, held_by_asset.id, by_age[-1].id}
        now = db_fetch(url, "SELECT now() AS now")[0]["now"]
        # The 100th newest is the first of a three: the boundary splits three equal created_at.
        cases = [
            {"keepNewest": 100},
            {"keepYoungerThanSeconds": 100 * HOUR + 1800},
            {"keepNewest": 100, "keepYoungerThanSeconds": 200 * HOUR + 1800},  # the age keeps more
            {"keepNewest": 700, "keepYoungerThanSeconds": 20 * HOUR + 1800},  # the count keeps more
            {"keepNewest": 5000},  # fewer artifacts than that: nothing goes
        ]
        for limits in cases:
            want = expected(artifacts, protected, limits.get("keepNewest"), limits.get("keepYoungerThanSeconds"), now)
            assert preview_ids(admin, "builds", 37, **limits) == want, limits
        assert not expected(artifacts, protected, 5000, None, now)

        # Saved but not enabled: a cleanup deletes nothing.
        rule = put_rule(admin, "builds", keepNewest=100, keepYoungerThanSeconds=200 * HOUR + 1800)
        assert rule["enabled"] is False and rule["lastAppliedAt"] is None and rule["deletedTotal"] == 0
        previewed = preview_ids(admin, "builds", 1000)
        assert previewed == preview_ids(admin, "builds", 1000, keepNewest=100, keepYoungerThanSeconds=200 * HOUR + 1800)
        assert previewed == expected(artifacts, protected, 100, 200 * HOUR + 1800, now)
        assert len(previewed) == 99 * 3 - 2  # 200.5 hours keep 201 threes; 2 of the other 297 are held
        result, _ = asyncio.run(run_cleanup(cluster, LONG_GRACE))
        assert result["steps"]["retention"] == {"deleted": 0, "repositories": 0, "more": False}
        assert len(left_in(url, repo_id)) == 900

        # Enabled: the cleanup deletes the preview's artifacts, and only those.
        put_rule(admin, "builds", keepNewest=100, keepYoungerThanSeconds=200 * HOUR + 1800, enabled=True)
        assert preview_ids(admin, "builds", 1000) == previewed
        result, lines = asyncio.run(run_cleanup(cluster, LONG_GRACE))
        assert result["steps"]["retention"] == {"deleted": len(previewed), "repositories": 1, "more": False}
        assert "retention rules:" in lines
        assert left_in(url, repo_id) == {a.id for a in artifacts} - set(previewed)
        assert protected <= left_in(url, repo_id)
        assert left_in(url, other_id) == {a.id for a in untouched}
        assert preview_ids(admin, "builds", 1000) == []
        # No history entry names a deleted artifact; the one of the current target stays.
        history = db_fetch(url, "SELECT artifact_id FROM arkvory_asset_history WHERE path = 'latest'")
        assert [r["artifact_id"] for r in history] == [by_age[-1].id]
        shown = admin.get("/api/v1/repositories/builds/retention").json()
        assert shown["deletedTotal"] == len(previewed) and shown["lastAppliedAt"] is not None
        # What the rule left is served as before; the package still downloads its artifact's row.
        assert admin.get(f"/api/v1/repositories/builds/artifacts/{held_by_package.id}").status_code == 200
        assert admin.get(f"/api/v1/repositories/builds/artifacts/{previewed[0]}").status_code == 404


def test_who_may_see_and_change_a_rule_and_what_the_api_refuses(cluster):
    writer = cluster.writer().wait_ready()
    for name in ("builds", "other", "hidden"):
        repository(writer, name)
    make_account(writer, "alice")
    make_account(writer, "bob")
    with writer.client(ADMIN_TOKEN) as admin:
        for account, repo, level in (("alice", "builds", "admin"), ("alice", "other", "write"), ("bob", "builds", "write")):
            assert admin.put(f"/api/v1/repositories/{repo}/permissions/{account}", json={"level": level}).status_code == 200
        assert admin.post("/api/v1/repositories/builds/artifacts", params={"name": "a"}, content=b"a").status_code == 201
    alice, bob = session_of(writer, "alice"), session_of(writer, "bob")
    base = "/api/v1/repositories/{}/retention"
    with writer.client(alice) as client:
        assert client.get(base.format("builds")).status_code == 404  # no rule yet
        assert client.get(base.format("builds") + "/preview").status_code == 404
        made = put_rule(client, "builds", keepNewest=3)
        assert made["enabled"] is False and made["keepYoungerThanSeconds"] is None and made["repository"] == "builds"
        assert client.get(base.format("builds")).json() == made
        assert client.get(base.format("builds") + "/preview").json()["rule"] == {
            "keepNewest": 3, "keepYoungerThanSeconds": None, "enabled": False}
        # A repository admin sets rules on its repositories only.
        for repo, status in (("other", 403), ("hidden", 404), ("missing", 404)):
            assert client.put(base.format(repo), json={"keepNewest": 1}).status_code == status, repo
            assert client.get(base.format(repo)).status_code == status, repo
            assert client.get(base.format(repo) + "/preview", params={"keepNewest": "1"}).status_code == status
            assert client.delete(base.format(repo)).status_code == status
    with writer.client(bob) as client:  # write is not admin
        assert client.get(base.format("builds")).status_code == 403
        assert client.put(base.format("builds"), json={"keepNewest": 1, "enabled": True}).status_code == 403
    for token, status in ((None, 401), (READER_TOKEN, 403), (OTHER_TOKEN, 404)):
        with writer.client(token) as client:
            assert client.get(base.format("builds")).status_code == status, token
            assert client.put(base.format("builds"), json={"keepNewest": 1}).status_code == status, token

    with writer.client(ADMIN_TOKEN) as admin:
        path = base.format("builds")
        refusals = [
            {}, {"enabled": True}, {"keepNewest": None, "keepYoungerThanSeconds": None},
            {"keepNewest": 0}, {"keepNewest": -1}, {"keepNewest": 100_001}, {"keepNewest": True},
            {"keepNewest": "3"}, {"keepNewest": 2.5}, {"keepYoungerThanSeconds": 59},
            {"keepYoungerThanSeconds": 100 * 365 * 86400 + 1}, {"keepNewest": 3, "enabled": "yes"},
            {"keepNewest": 3, "keepAll": True}, {"keepNewest": 10 ** 40},
        ]
        for body in refusals:
            answer = admin.put(path, json=body)
            assert answer.status_code == 400 and answer.json()["code"] == "invalid_input", (body, answer.text)
        assert admin.put(path, content=b"[1]", headers={"Content-Type": "application/json"}).status_code == 400
        for query in ({"keepNewest": "0"}, {"keepNewest": "x"}, {"keepYoungerThanSeconds": "5"}, {"sha256": "a"},
                      {"limit": "0"}, {"cursor": "nope"}, {"keepNewest": "9" * 30}):
            answer = admin.get(path + "/preview", params=query)
            assert answer.status_code == 400, (query, answer.text)
        unknown = admin.get(path + "/preview", params={"order": "newest"}).json()["message"]
        assert "'order'" in unknown
        assert admin.get(base.format("hidden") + "/preview", params={"keepNewest": "1"}).json()["items"] == []
        # An Idempotency-Key replays the first answer; other parameters with it are refused.
        key = {"Idempotency-Key": "retention-1"}
        first = admin.put(path, json={"keepNewest": 7, "enabled": True}, headers=key)
        again = admin.put(path, json={"keepNewest": 7, "enabled": True}, headers=key)
        assert first.status_code == again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
        assert again.json() == first.json() and first.json()["enabled"] is True
        assert admin.put(path, json={"keepNewest": 8}, headers=key).status_code == 422
        # A PUT without `enabled` disables: changing an enabled rule's limits takes `enabled` again.
        assert put_rule(admin, "builds", keepNewest=8)["enabled"] is False
        assert admin.delete(path).status_code == 204
        assert admin.delete(path).status_code == 404
        assert admin.get(path).status_code == 404
        # Deleting the repository deletes its rule.
        put_rule(admin, "other", keepNewest=1, enabled=True)
        assert admin.delete("/api/v1/repositories/other").status_code == 204
    assert db_fetch(cluster.database_url, "SELECT repository_id FROM arkvory_retention_rules") == []


def test_a_deleted_artifact_takes_its_history_entries_along_and_a_held_one_stays(cluster):
    """The user's delete and retention share one delete: history entries of a deleted artifact go
    with it, an artifact a package or asset holds is refused (409) as before."""
    writer = cluster.writer().wait_ready()
    repository(writer, "r")
    with writer.client(ADMIN_TOKEN) as admin:
        first, second = (admin.post("/api/v1/repositories/r/artifacts", params={"name": n}, content=n.encode()).json()
                         for n in ("one", "two"))
        for target in (first, second, first, second):
            assert admin.put("/api/v1/repositories/r/assets", params={"path": "p"},
                             json={"artifactId": target["id"]}).status_code == 200
        assert admin.delete(f"/api/v1/repositories/r/artifacts/{second['id']}").status_code == 409
        assert admin.delete(f"/api/v1/repositories/r/artifacts/{first['id']}").status_code == 204
        history = admin.get("/api/v1/repositories/r/asset", params={"path": "p"}).json()["history"]
        assert [h["artifactId"] for h in history] == [second["id"], second["id"]]
        assert admin.delete(f"/api/v1/repositories/r/artifacts/{first['id']}").status_code == 404


def test_turns_share_each_run_between_repositories(cluster, monkeypatch):
    """A repository with a large backlog goes first and takes a turn; the others take theirs in
    the same round, and the run's bound leaves the rest of the backlog to the next run, which
    starts with the repositories this one served least recently. (The bounds are made small
    here, in this process; the worker's are PER_RUN and TURN.)"""
    monkeypatch.setattr(retention_step, "PER_RUN", 25)
    monkeypatch.setattr(retention_step, "TURN", 10)
    writer = cluster.writer().wait_ready()
    url = cluster.database_url
    ids = {name: repository(writer, name) for name in ("huge", "a", "b")}
    seed(url, ids["huge"], [1] * 100)
    for name in ("a", "b"):
        seed(url, ids[name], [1] * 5)
    with writer.client(ADMIN_TOKEN) as admin:
        for name in ids:
            put_rule(admin, name, keepYoungerThanSeconds=60, enabled=True)
    # The backlog's turn comes first (it was served longest ago), the others never before.
    for name, hours_ago in (("huge", 24), ("a", 2), ("b", 1)):
        db_execute(url, "UPDATE arkvory_retention_rules SET turn_at = now() - $2::interval WHERE repository_id = $1",
                   ids[name], datetime.timedelta(hours=hours_ago))
    result, _ = asyncio.run(run_cleanup(cluster, LONG_GRACE))
    assert result["steps"]["retention"] == {"deleted": 25, "repositories": 3, "more": True}
    # huge 10, a 5, b 5, huge 5: both small repositories done in the first round.
    assert (len(left_in(url, ids["huge"])), len(left_in(url, ids["a"])), len(left_in(url, ids["b"]))) == (85, 0, 0)
    turns = {r["repository_id"]: r["turn_at"] for r in db_fetch(url, "SELECT repository_id, turn_at FROM arkvory_retention_rules")}
    assert turns[ids["a"]] < turns[ids["b"]] < turns[ids["huge"]]
    # Work left: the next runs go on with it, the bound each time.
    for left in (60, 35, 10, 0):
        result, _ = asyncio.run(run_cleanup(cluster, LONG_GRACE))
        assert len(left_in(url, ids["huge"])) == left
    assert result["steps"]["retention"]["more"] is False


@pytest.fixture
def quiet_writer(cluster):
    # No scheduled cleanup: the tests decide which tasks the worker sees.
    return cluster.writer(ARKVORY_CLEANUP_INTERVAL="off").wait_ready()


def test_the_budget_bounds_retention_like_every_cleanup_step(cluster, quiet_writer):
    url = cluster.database_url
    repo_id = repository(quiet_writer, "r")
    seed(url, repo_id, [10] * 20)
    with quiet_writer.client(ADMIN_TOKEN) as admin:
        put_rule(admin, "r", keepNewest=2, enabled=True)
    start_worker(cluster, real=True).wait_active()
    left = 20
    # An artifact is an item and a row's cost unit; a turn that deletes is a transition.
    for budget, message, gone in (
        ({"max_items": 3}, "max_items exceeded: 4 > 3", 3),
        ({"max_cost_units": 4}, "max_cost_units exceeded: 5 > 4", 4),
    ):
        failed = wait_task(url, dispatch(url, "cleanup", LONG_GRACE, budget=budget), ("failed", "completed"))
        assert (failed["status"], failed["error_code"], failed["error_message"]) == ("failed", "budget_exceeded", message)
        assert failed["usage"]["items"] == gone, failed["usage"]
        left -= gone
        assert len(left_in(url, repo_id)) == left
    # Exactly what is left (the newest 2 stay): within the budget, completed.
    done = wait_task(url, dispatch(url, "cleanup", LONG_GRACE, budget={"max_items": left - 2}), ("failed", "completed"))
    assert done["status"] == "completed", done
    assert done["result"]["steps"]["retention"]["deleted"] == left - 2 and done["usage"]["items"] == left - 2
    assert len(left_in(url, repo_id)) == 2


def test_a_cleanup_killed_after_a_turn_keeps_its_usage_and_the_retry_stays_within_the_budget(cluster, quiet_writer):
    """SIGKILL right after retention's first turn committed: the usage on record is what it
    deleted (it commits with the turn), and the retry, which goes on from that usage, deletes
    nothing more than `max_items` allows in all."""
    url = cluster.database_url
    repo_id = repository(quiet_writer, "r")
    seed(url, repo_id, [10] * 30)
    with quiet_writer.client(ADMIN_TOKEN) as admin:
        put_rule(admin, "r", keepNewest=1, enabled=True)
    worker = start_worker(
        cluster, "killed", TEST_WORKER_KILL_AT="arkvory.writer.maintenance.retention:take_turn:after:1"
    ).wait_active()
    task_id = dispatch(url, "cleanup", LONG_GRACE, on_restart="retry", budget={"max_items": 12})
    assert worker.wait_exit(60) == -signal.SIGKILL, worker.stderr
    recorded = task(url, task_id)
    assert recorded["status"] == "running" and len(left_in(url, repo_id)) == 30 - 12, recorded
    assert recorded["usage"]["items"] == 12 and recorded["usage"]["cost_units"] == 12, recorded["usage"]

    start_worker(cluster, "next").wait_active()
    ended = wait_task(url, task_id, ("failed", "completed"), timeout=60)
    assert (ended["status"], ended["error_code"]) == ("failed", "budget_exceeded"), ended
    assert ended["attempts"] == 2 and ended["usage"]["items"] == 12, ended
    assert len(left_in(url, repo_id)) == 30 - 12, "the retry deleted more than the budget allows"


def test_a_cleanup_task_applies_enabled_rules_and_frees_the_blobs(cluster):
    """A cleanup dispatched through the API with its default params: the rule's artifacts
    go, and their blobs with them in the same run once older than the grace period."""
    writer = cluster.writer().wait_ready()
    url = cluster.database_url
    repository(writer, "r")
    contents = [os.urandom(1000 + n) for n in range(4)]
    with writer.client(ADMIN_TOKEN) as admin:
        made = [admin.post("/api/v1/repositories/r/artifacts", params={"name": f"{n}.bin"}, content=c).json()
                for n, c in enumerate(contents)]
        put_rule(admin, "r", keepNewest=1, enabled=True)
        doomed = [a["id"] for a in made[:3]]
        listed = [a["id"] for a in admin.get("/api/v1/repositories/r/retention/preview").json()["items"]]
        assert listed == doomed
        worker = start_worker(cluster, real=True).wait_active()
        task_id = admin.post("/api/v1/tasks", json={"kind": "cleanup", "params": {"grace_seconds": 0}}).json()["id"]
        done = wait_task(url, uuid.UUID(task_id), ("failed", "completed"))
        assert done["status"] == "completed", done
        assert done["result"]["steps"]["retention"]["deleted"] == 3
        assert done["result"]["steps"]["blobs"]["deleted"] == 3
        assert [a["id"] for a in admin.get("/api/v1/repositories/r/artifacts").json()["items"]] == [made[3]["id"]]
        assert admin.get(f"/api/v1/repositories/r/artifacts/{made[3]['id']}/content").content == contents[3]
    assert "arkvory_cleanup_retention_deleted_artifacts_total 3.0" in worker.get("/health/metrics").text
