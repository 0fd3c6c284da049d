"""`arkvory admin`: new-key output, status (a table for people, JSON for machines), the policy
reset that refuses live leases, and one line naming what to set when no database is given."""

from __future__ import annotations

import hashlib
import json
import re
import time
import tomllib

import pytest

from arkvory.shared.auth.identity import KeyRing

from .harness import db_fetch, run_arkvory

pytestmark = [pytest.mark.timeout(120)]


def test_new_key_prints_a_token_once_and_a_matching_stanza(cluster):
    result = run_arkvory(cluster.base_env(), "admin", "new-key", "--id", "ci", "--scope", "read:*")
    assert result.returncode == 0, result.stderr
    token = re.search(r"token \(shown once, store it now\): (\S+)", result.stderr).group(1)
    assert token not in result.stdout
    assert hashlib.sha256(token.encode()).hexdigest() in result.stdout
    ring = KeyRing.from_entries(tomllib.loads(result.stdout)["key"])
    principal = ring.lookup(token)
    assert principal is not None and principal.may_read("anything")


def test_new_key_refuses_a_bad_scope(cluster):
    result = run_arkvory(cluster.base_env(), "admin", "new-key", "--id", "ci", "--scope", "root")
    assert result.returncode == 2
    assert "scopes" in result.stderr


def test_reset_refuses_while_a_lease_is_live_then_works(cluster):
    shared = cluster.shared_env()
    writer = cluster.writer(shared).wait_ready()
    env = cluster.base_env()
    refused = run_arkvory(env, "admin", "reset-download-policy")
    assert refused.returncode == 1
    assert "leases are still live" in refused.stderr and "slot 0" in refused.stderr
    status = run_arkvory(env, "admin", "status")
    assert re.search(r"^0 +api +\d+ +\S+ +1 +expires in \d", status.stdout, re.M), status.stdout

    writer.kill()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        done = run_arkvory(env, "admin", "reset-download-policy")
        if done.returncode == 0:
            break
        time.sleep(1)
    assert done.returncode == 0, done.stderr
    assert db_fetch(cluster.database_url, "SELECT * FROM arkvory_download_policy") == []
    assert db_fetch(cluster.database_url, "SELECT * FROM arkvory_gateway_leases") == []
    # A standalone writer may start again now.
    cluster.writer().wait_ready()


def test_status_is_a_table_for_people_and_json_for_machines(cluster):
    writer = cluster.writer(cluster.shared_env(slots=2, total=4 * 1024 * 1024)).wait_ready()
    env = cluster.base_env()
    table = run_arkvory(env, "admin", "status")
    assert table.returncode == 0, table.stderr
    assert "2 slots, saved " in table.stdout
    assert "4,194,304 bytes/s (4.0 MiB/s)" in table.stdout
    assert re.search(r"^slot +role +pid +host +generation +lease$", table.stdout, re.M)
    assert re.search(rf"^0 +api +{writer.proc.pid} +\S+ +1 +expires in \d", table.stdout, re.M)
    assert not re.search(r"Record|datetime|Decimal|\{|\.\d{6}", table.stdout)  # no reprs, no µs

    report = json.loads(run_arkvory(env, "admin", "status", "--json").stdout)
    assert report["schemaVersion"] >= 1
    assert report["downloadPolicy"]["totalBytesPerSecond"] == 4 * 1024 * 1024
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", report["downloadPolicy"]["savedAt"])
    (lease,) = report["leases"]
    assert (lease["slot"], lease["role"], lease["pid"], lease["live"]) == (0, "api", writer.proc.pid, True)
    assert 0 < lease["expiresInSeconds"] <= 10

    writer.kill()
    deadline = time.monotonic() + 15
    while json.loads(run_arkvory(env, "admin", "status", "--json").stdout)["leases"][0]["live"]:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert re.search(r"^0 +api .* expired [\d.]+ (s|min) ago$", run_arkvory(env, "admin", "status").stdout, re.M)


@pytest.mark.parametrize("action", ["status", "reset-download-policy"])
def test_no_database_is_one_line_naming_the_variable_and_dev(cluster, action):
    env = cluster.base_env(ARKVORY_DATABASE_URL=None)
    result = run_arkvory(env, "admin", action)
    assert result.returncode == 2
    assert result.stderr == (
        "arkvory: no database: set ARKVORY_DATABASE_URL, or pass --dev [DIR] to use a running arkvory dev\n"
    )
    missing = cluster.workdir / "nothing-here"
    result = run_arkvory(env, "admin", action, "--dev", str(missing))
    assert result.returncode == 2
    assert result.stderr == f"arkvory: no arkvory dev is running in {missing}: start one with arkvory dev --dir {missing}\n"
