"""`arkvory retention show|set|preview|disable REPO` (issue 25 item 10), end to end: the real CLI in
a subprocess, as a repository admin's session, against a real writer; the cleanup then deletes
exactly what `preview` listed.
"""

from __future__ import annotations

import asyncio

import pytest

from .harness import ADMIN_TOKEN, db_execute
from .test_accounts import make_account, session_of
from .test_cleanup import run_cleanup
from .test_cli import arkvory, assert_exit, cli_env, json_of

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def home(tmp_path):
    path = tmp_path / "home"
    path.mkdir()
    return path


def test_show_set_preview_enable_disable_and_delete_from_the_command_line(cluster, home, tmp_path):
    writer = cluster.writer().wait_ready()
    with writer.client(ADMIN_TOKEN) as admin:
        assert admin.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
        made = [admin.post("/api/v1/repositories/builds/artifacts", params={"name": f"b{n}.tar"},
                           content=b"y" * (n + 1)).json() for n in range(5)]
    # b0 is 5.5 hours old ... b4 1.5 hours old.
    db_execute(cluster.database_url, "UPDATE arkvory_artifacts a SET created_at = now() - make_interval(mins => 90 + 60 * t.age)"
               " FROM unnest($1::uuid[], $2::integer[]) AS t(id, age) WHERE a.id = t.id",
               [a["id"] for a in made], [4, 3, 2, 1, 0])
    for name, level in (("ops", "admin"), ("dev", "write")):
        make_account(writer, name)
        with writer.client(ADMIN_TOKEN) as admin:
            assert admin.put(f"/api/v1/repositories/builds/permissions/{name}", json={"level": level}).status_code == 200
    ops = cli_env(home, writer.url, token=session_of(writer, "ops"))

    def run(*args: str, code: int = 0):
        done = arkvory(ops, tmp_path, "retention", *args)
        assert_exit(done, code)
        return done

    missing = run("show", "builds", code=4)
    assert "'builds' has no retention rule" in missing.stderr
    assert "give --keep-newest N, --keep-younger-than DURATION or both" in run("set", "builds", code=2).stderr
    for bad in (("--keep-newest", "0"), ("--keep-newest", "x"), ("--keep-younger-than", "5s"),
                ("--keep-younger-than", "37000d")):
        run("set", "builds", *bad, code=2)

    saved = run("set", "builds", "--keep-newest", "2", "--keep-younger-than", "3h")
    assert "saved disabled: it deletes nothing" in saved.stderr and "arkvory retention preview builds" in saved.stderr
    assert "enabled            no (deletes nothing)" in saved.stdout and "keep younger than  3h" in saved.stdout

    # The dry run: b0, b1, b2 are beyond the newest 2 and 3 hours old or more.
    listed = run("preview", "builds")
    assert "the next cleanup would delete 3 artifact(s) of builds, 6 B" in listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == [a["id"] for a in made[:3]]
    as_json = json_of(run("preview", "builds", "--json", "--limit", "1"))
    assert as_json["count"] == 3 and as_json["bytes"] == 6 and [a["id"] for a in as_json["artifacts"]] == [made[0]["id"]]
    tried = json_of(run("preview", "builds", "--json", "--keep-newest", "1"))
    assert [a["id"] for a in tried["artifacts"]] == [a["id"] for a in made[:4]]
    assert run("preview", "builds", "--keep-newest", "5").stdout.strip() == "nothing would be deleted"

    enabled = json_of(run("set", "builds", "--keep-newest", "2", "--keep-younger-than", "3h", "--enable", "--json"))
    assert enabled["enabled"] is True and enabled["keepYoungerThanSeconds"] == 3 * 3600
    result, _ = asyncio.run(run_cleanup(cluster, {"grace_seconds": 86400}))
    assert result["steps"]["retention"]["deleted"] == 3
    with writer.client(ADMIN_TOKEN) as admin:
        left = [a["id"] for a in admin.get("/api/v1/repositories/builds/artifacts").json()["items"]]
    assert left == [a["id"] for a in made[3:]]
    shown = run("show", "builds")
    assert "deleted in all     3" in shown.stdout and "last applied       never" not in shown.stdout

    disabled = run("disable", "builds")
    assert "is disabled: it deletes nothing until enabled again" in disabled.stderr
    assert json_of(run("show", "builds", "--json"))["enabled"] is False
    assert json_of(run("disable", "builds", "--delete", "--json")) == {"repository": "builds", "deleted": True}
    run("show", "builds", code=4)
    run("disable", "builds", code=4)

    # Who may not administer the repository is refused (exit 3), a repository it cannot see is 4.
    dev = cli_env(home, writer.url, token=session_of(writer, "dev"))
    assert_exit(arkvory(dev, tmp_path, "retention", "set", "builds", "--keep-newest", "1", "--enable"), 3)
    assert_exit(arkvory(dev, tmp_path, "retention", "show", "nowhere"), 4)
