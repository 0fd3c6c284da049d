"""`arkvory admin`: new-key output, status, and the policy reset that refuses live leases."""

from __future__ import annotations

import hashlib
import re
import time
import tomllib

import pytest

from shared.identity import KeyRing

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
    assert "slot 0: api" in status.stdout and "live for" in status.stdout

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
