"""`arkvory admin`: new-key output, status (a table for people, JSON for machines; the leases and
the workers), the policy reset that refuses live leases, init (the writer's first start without
a server), and one line naming what to set when no database is given."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
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


def test_a_reader_that_goes_away_stops_the_command_quietly(cluster):
    """`arkvory admin status | head`: the pipe closes before the output is written; the command
    exits as a C tool killed by SIGPIPE would, without a traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "arkvory.shared.cli.main", "admin", "status"],
            env=cluster.base_env(), stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60,
        )
    finally:
        os.close(write_end)
    assert result.returncode == 128 + signal.SIGPIPE, result.stderr
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr


def test_new_key_refuses_a_bad_scope(cluster):
    result = run_arkvory(cluster.base_env(), "admin", "new-key", "--id", "ci", "--scope", "root")
    assert result.returncode == 2
    assert "scopes" in result.stderr


@pytest.mark.soak  # 10 s or more of real time (the reservation stays proven by test_lease_processes): .ci/run runs it (pytest -m soak)
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


# -- admin init ------------------------------------------------------------------------------


def test_init_creates_the_schema_and_storage_then_finds_them_and_the_writer_uses_them(cluster):
    env = cluster.base_env()
    first = run_arkvory(env, "admin", "init")
    assert first.returncode == 0, first.stderr
    assert re.search(r"^schema +migrated from version 0 to \d+$", first.stdout, re.M), first.stdout
    created = re.search(rf"^storage +created {re.escape(str(cluster.data_dir))} \(storage id (\S+),", first.stdout, re.M)
    assert created, first.stdout
    storage_id = created.group(1)
    assert (cluster.data_dir / "arkvory-storage-id").read_text().strip() == storage_id
    assert (cluster.data_dir / "blobs" / "sha256").is_dir()
    assert "download policy  none (a standalone writer" in first.stdout
    assert [str(r["storage_id"]) for r in db_fetch(cluster.database_url, "SELECT storage_id FROM arkvory_storage")] == [storage_id]
    assert not db_fetch(cluster.database_url, "SELECT * FROM arkvory_gateway_leases")  # no server ran

    again = run_arkvory(env, "admin", "init")  # safe to repeat: nothing new, each line says so
    assert again.returncode == 0, again.stderr
    assert re.search(r"^schema +version \d+, up to date$", again.stdout, re.M)
    assert f"storage id {storage_id}, this database's" in again.stdout

    writer = cluster.writer().wait_ready()
    assert (cluster.data_dir / "arkvory-storage-id").read_text().strip() == storage_id
    # Beside a running writer it only checks, and says so.
    beside = run_arkvory(env, "admin", "init")
    assert beside.returncode == 0, beside.stderr
    assert "a writer is running against this database" in beside.stdout
    assert f"storage id {storage_id}, this database's" in beside.stdout
    writer.kill()


def test_init_saves_the_download_policy_and_a_gateway_may_follow_the_writer(cluster):
    shared = cluster.shared_env(slots=2, total=4 * 1024 * 1024)
    env = cluster.base_env(ARKVORY_GATEWAY_SLOT="0", **shared)
    done = run_arkvory(env, "admin", "init")
    assert done.returncode == 0, done.stderr
    assert "download policy  saved: 2 slots, total 4,194,304 bytes/s" in done.stdout
    other = run_arkvory(cluster.base_env(ARKVORY_GATEWAY_SLOT="0", **cluster.shared_env(slots=3)), "admin", "init")
    assert other.returncode == 78  # the same refusal as the writer's
    assert "the database requires the shared download configuration saved as" in other.stderr
    kept = run_arkvory(cluster.base_env(), "admin", "init")  # without the variables: left alone
    assert kept.returncode == 0 and "2 slots" in kept.stdout and "(saved before; kept)" in kept.stdout
    cluster.writer(shared).wait_ready()
    cluster.gateway(1, shared).wait_ready()


def test_init_refuses_a_foreign_storage_directory_as_the_writer_does(cluster, tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "arkvory-storage-id").write_text("00000000-0000-0000-0000-000000000001\n")
    env = cluster.base_env(ARKVORY_DATA_DIR=str(foreign))
    refused = run_arkvory(env, "admin", "init")
    assert refused.returncode == 78
    assert refused.stderr == (
        f"arkvory: storage directory {foreign} has storage id 00000000-0000-0000-0000-000000000001, but the"
        " database has none: this directory belongs to another database\n"
    )
    writer = run_arkvory(env, "serve", timeout=30)  # the writer says the very same
    assert writer.returncode == 78 and refused.stderr in writer.stderr


def test_init_and_status_on_an_object_store_and_init_again_after_it_stopped_half_way(s3_cluster):
    """Issue 22: on S3 storage `admin init` made the schema and the storage id, then crashed (exit
    1) before saving the download policy. The first run here leaves that very state (no policy:
    no shared variables); the next, with them, completes."""
    env = s3_cluster.base_env()
    location = f"s3://{s3_cluster.bucket.name}/{s3_cluster.prefix}"
    first = run_arkvory(env, "admin", "init")
    assert first.returncode == 0, first.stderr
    created = re.search(
        rf"^storage +created {re.escape(location)} \(storage id (\S+), in its arkvory-storage-id object"
        r" and the database\)$", first.stdout, re.M,
    )
    assert created, first.stdout
    storage_id = created.group(1)
    assert asyncio.run(s3_cluster.object_store().read_identity()) == storage_id
    assert [str(r["storage_id"]) for r in db_fetch(s3_cluster.database_url, "SELECT storage_id FROM arkvory_storage")] == [storage_id]
    assert "download policy  none (a standalone writer" in first.stdout

    shared = s3_cluster.shared_env(slots=2, total=4 * 1024 * 1024)
    again = run_arkvory(s3_cluster.base_env(ARKVORY_GATEWAY_SLOT="0", **shared), "admin", "init")
    assert again.returncode == 0, again.stderr
    assert re.search(r"^schema +version \d+, up to date$", again.stdout, re.M)
    assert f"storage          {location}: storage id {storage_id}, this database's" in again.stdout
    assert "download policy  saved: 2 slots, total 4,194,304 bytes/s" in again.stdout
    assert again.stdout.endswith("ready: start the writer, then the gateways and the worker\n")

    status = run_arkvory(env, "admin", "status")
    assert status.returncode == 0, status.stderr
    assert f"storage          {location} (storage id {storage_id})" in status.stdout
    assert "download policy  2 slots" in status.stdout
    report = json.loads(run_arkvory(env, "admin", "status", "--json").stdout)
    assert report["storage"] == {"id": storage_id, "location": location}

    writer = s3_cluster.writer(shared).wait_ready()
    beside = run_arkvory(env, "admin", "init")  # beside a running writer: it only checks
    assert beside.returncode == 0, beside.stderr
    assert "a writer is running against this database" in beside.stdout
    assert f"storage          {location}: storage id {storage_id}, this database's" in beside.stdout
    writer.kill()
    s3_cluster.assert_secret_nowhere(first.stdout, again.stdout, status.stdout, beside.stdout)


def test_init_with_a_gateway_s_settings_or_no_database_is_one_line(cluster):
    gateway = run_arkvory(cluster.base_env(ARKVORY_ROLE="reader", ARKVORY_GATEWAY_SLOT="1", **cluster.shared_env()), "admin", "init")
    assert gateway.returncode == 2 and "run it with the writer's settings" in gateway.stderr
    nothing = run_arkvory(cluster.base_env(ARKVORY_DATABASE_URL=None), "admin", "init")
    assert nothing.returncode == 2 and "ARKVORY_DATABASE_URL" in nothing.stderr
    unreachable = run_arkvory(cluster.base_env(ARKVORY_DATABASE_URL="postgresql://nobody:secret@127.0.0.1:1/x"), "admin", "init")
    assert unreachable.returncode == 69 and "secret" not in unreachable.stderr


# -- admin status: the worker ------------------------------------------------------------------


def test_status_shows_the_active_worker_and_the_standby_with_their_hosts(cluster):
    from .worker_harness import start_worker

    cluster.writer().wait_ready()
    env = cluster.base_env()
    idle = json.loads(run_arkvory(env, "admin", "status", "--json").stdout)
    assert idle["workers"] == []
    assert "worker           none running" in run_arkvory(env, "admin", "status").stdout
    first = start_worker(cluster, "first").wait_active()
    second = start_worker(cluster, "second").wait_status("standby")
    report = json.loads(run_arkvory(env, "admin", "status", "--json").stdout)
    host = socket.gethostname()
    assert [(w["state"], w["pid"], w["host"]) for w in report["workers"]] == [
        ("active", first.proc.pid, host), ("standby", second.proc.pid, host)
    ]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", w["connectedAt"]) for w in report["workers"])
    table = run_arkvory(env, "admin", "status").stdout
    assert "worker           active, 1 standing by" in table
    assert re.search(rf"^active +{first.proc.pid} +{re.escape(host)} +\S", table, re.M), table
    assert re.search(rf"^standby +{second.proc.pid} +{re.escape(host)} +\S", table, re.M), table
