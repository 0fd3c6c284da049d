"""Password hashes (issue 13): scrypt at OWASP's cost, old hashes still verify and are replaced at
the next successful login; hashing runs off the event loop, a bounded number at once."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time

import pytest

from arkvory.shared.errors import Busy
from arkvory.writer.identity.passwords import PasswordHash, PasswordHasher, hash_password, needs_rehash, verify_password

from .harness import db_execute, db_fetch
from .test_accounts import PASSWORD, login, make_account

pytestmark = pytest.mark.timeout(120)

OWASP = (2**17, 8, 1)


def old_hash(password: str) -> PasswordHash:
    """A hash as the writer made them before issue 13 (N=2^14)."""
    salt = os.urandom(16)
    return PasswordHash(hashlib.scrypt(password.encode(), salt=salt, n=2**14, r=8, p=1, dklen=32), salt, 2**14, 8, 1)


def test_new_hashes_use_owasps_cost_and_old_ones_still_verify():
    new = hash_password(PASSWORD)
    assert (new.n, new.r, new.p) == OWASP and not needs_rehash(new)
    assert verify_password(PASSWORD, new) and not verify_password("not the password", new)
    old = old_hash(PASSWORD)
    assert needs_rehash(old)
    assert verify_password(PASSWORD, old) and not verify_password("not the password", old)


def test_hashing_runs_off_the_event_loop_and_a_bounded_number_at_once():
    async def scenario():
        hasher = PasswordHasher(concurrent=1, waiting=1)
        stored = hash_password(PASSWORD)
        ticks, lags = 0, []

        async def ticker():
            nonlocal ticks
            while True:
                started = time.perf_counter()
                await asyncio.sleep(0.01)
                lags.append(time.perf_counter() - started)
                ticks += 1

        ticking = asyncio.ensure_future(ticker())
        results = await asyncio.gather(*(hasher.verify(PASSWORD, stored) for _ in range(4)), return_exceptions=True)
        ticking.cancel()
        return results, lags

    results, lags = asyncio.run(scenario())
    assert results[:2] == [True, True]  # one running, one waiting
    assert all(isinstance(r, Busy) for r in results[2:]), results  # the rest refused at once
    assert len(lags) > 10 and max(lags) < 0.2, max(lags)  # the loop kept running meanwhile


def test_an_old_hash_is_replaced_at_the_next_successful_login(cluster):
    writer = cluster.writer().wait_ready()
    make_account(writer, "alice")
    old = old_hash(PASSWORD)
    db_execute(
        cluster.database_url,
        "UPDATE arkvory_accounts SET password_hash = $1, password_salt = $2, scrypt_n = $3, scrypt_r = $4,"
        " scrypt_p = $5 WHERE name = 'alice'",
        old.digest, old.salt, old.n, old.r, old.p,
    )
    assert login(writer, "alice", "not the password").status_code == 401
    assert db_fetch(cluster.database_url, "SELECT scrypt_n FROM arkvory_accounts")[0]["scrypt_n"] == 2**14

    assert login(writer, "alice").status_code == 200
    row = db_fetch(cluster.database_url, "SELECT * FROM arkvory_accounts WHERE name = 'alice'")[0]
    assert (row["scrypt_n"], row["scrypt_r"], row["scrypt_p"]) == OWASP
    assert bytes(row["password_hash"]) != old.digest and bytes(row["password_salt"]) != old.salt
    assert verify_password(PASSWORD, PasswordHash(bytes(row["password_hash"]), bytes(row["password_salt"]), *OWASP))
    assert login(writer, "alice").status_code == 200
    assert login(writer, "alice", "not the password").status_code == 401
