"""Account names are one name in any case (issue 22 §1, SPEC §5): `bob` and `BOB` cannot both
exist, by any way of making an account; any spelling signs in to the one account and counts
against its one login limit; and migration 0012 refuses a database that already holds such
twins, naming them on one line, until an operator renames them."""

from __future__ import annotations

import asyncio

import asyncpg
import httpx
import pytest

from arkvory.shared import db
from arkvory.writer.identity.account_names import FOLDED_NAME, fold
from arkvory.writer.identity.login_limits import ACCOUNT_LIMIT
from arkvory.writer.identity.passwords import hash_password

from .console_client import Console, messages
from .harness import ADMIN_TOKEN, db_execute, db_fetch, run_arkvory
from .test_accounts import PASSWORD, create_user, login, make_account

pytestmark = pytest.mark.timeout(180)

WRONG = "not the password"


def test_python_and_postgresql_fold_every_string_alike(cluster):
    """The one form: what the limits and cookies key on (Python) is what the database looks up
    and indexes (SQL), for names as typed at a login, not only valid ones."""
    samples = [
        "bob", "BOB", "Bob.Smith@Example-1_x", "İstanbul", "ıI", "ſam", "\u212aelvin", "STRASSE", "Straße",
        "ÀÉÎ", "ǅ", "ﬀ", "Σ", "\u0130\u0307", "",
    ]
    rows = db_fetch(
        cluster.database_url, f"SELECT name, {FOLDED_NAME} AS folded FROM unnest($1::text[]) AS t(name)", samples
    )
    assert {r["name"]: r["folded"] for r in rows} == {s: fold(s) for s in samples}
    # The fold a reader might reach for does not agree with the database: the reason for ours.
    assert fold("ſam") != "sam" == "ſam".casefold()


def test_a_name_taken_in_any_case_is_409_however_the_account_is_made(cluster):
    writer = cluster.writer(ARKVORY_ALLOW_SIGNUP="true").wait_ready()
    make_account(writer, "bob")
    make_account(writer, "root", admin=True)
    with writer.client(ADMIN_TOKEN) as admin:
        twin = admin.post("/api/v1/accounts", json={"name": "BOB", "password": PASSWORD})
        assert twin.status_code == 409 and twin.json()["code"] == "conflict", twin.text
    with writer.client(None) as anyone:
        registered = anyone.post("/api/v1/register", json={"name": "Bob", "password": PASSWORD})
        assert registered.status_code == 409, registered.text
    made = create_user(cluster, "bOB", PASSWORD)
    assert made.returncode == 1 and "already exists" in made.stderr, made.stderr
    with Console(writer.url) as console:
        console.signed_in("root", PASSWORD)
        shown = console.submit("/console/accounts", "/console/accounts", name="BoB", password=PASSWORD)
        assert shown.status_code == 409 and "already exists" in messages(shown)[0], shown.text
    names = [r["name"] for r in db_fetch(cluster.database_url, "SELECT name FROM arkvory_accounts ORDER BY 1")]
    assert names == ["bob", "root"]


def test_any_spelling_signs_in_to_the_one_account_and_counts_against_its_one_limit(cluster):
    writer = cluster.writer(ARKVORY_TRUSTED_PROXIES="127.0.0.1").wait_ready()
    make_account(writer, "bob")

    def attempt(address: str, name: str, password: str, cookie: str | None = None) -> httpx.Response:
        headers = {"X-Forwarded-For": address}
        if cookie is not None:
            headers["Cookie"] = f"arkvory_device={cookie}"
        with writer.client(None) as client:
            return client.post("/api/v1/login", json={"name": name, "password": password}, headers=headers)

    signed_in = attempt("198.51.100.1", "BOB", PASSWORD)
    assert signed_in.status_code == 200, signed_in.text
    assert signed_in.json()["account"]["name"] == "bob"  # the account keeps its own spelling
    device = signed_in.cookies["arkvory_device"]
    spellings = ["bob", "BOB", "Bob", "bOb", "boB", "BoB"]
    for i, spelling in enumerate(spellings[:ACCOUNT_LIMIT]):
        assert attempt(f"203.0.113.{i + 1}", spelling, WRONG).status_code == 401
    # Every spelling waits now, the right password too: one account, one limit.
    for spelling in spellings:
        assert attempt("203.0.113.99", spelling, PASSWORD).status_code == 429, spelling
    # The device that signed in as BOB is bob's, under any spelling.
    assert attempt("198.51.100.1", "bOB", PASSWORD, device).status_code == 200
    # An administrator names the account in any spelling too.
    with writer.client(ADMIN_TOKEN) as admin:
        assert admin.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
        granted = admin.put("/api/v1/repositories/builds/permissions/BOB", json={"level": "read"})
        assert granted.status_code == 200, granted.text
        assert granted.json()["account"] == "bob"  # the name as stored, whatever spelling named it
        listed = admin.get("/api/v1/repositories/builds/permissions").json()["items"]
        assert [(m["account"], m["level"]) for m in listed] == [("bob", "read")]
        disabled = admin.post("/api/v1/accounts/Bob/disable")
        assert disabled.status_code == 200 and disabled.json()["name"] == "bob", disabled.text


# -- migration 0012 on a database that already holds twins --------------------------------------------


def migrate_up_to(database_url: str, last: int) -> None:
    """The schema as a writer of an older version left it: migrations 1..`last` applied."""

    async def run() -> None:
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute(
                "CREATE TABLE arkvory_schema_version (version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            for version, name, sql in db.migrations()[:last]:
                await conn.execute(sql)
                await conn.execute("INSERT INTO arkvory_schema_version (version, name) VALUES ($1, $2)", version, name)
        finally:
            await conn.close()

    asyncio.run(run())


def test_the_migration_refuses_a_database_with_twins_naming_them_on_one_line(cluster):
    url = cluster.database_url
    migrate_up_to(url, 11)
    hashed = hash_password(PASSWORD)
    for name in ("bob", "BOB", "alice", "Alice", "ALICE", "carol"):
        db_execute(
            url, "INSERT INTO arkvory_accounts (id, name, password_hash, password_salt, scrypt_n, scrypt_r, scrypt_p)"
            " VALUES (gen_random_uuid(), $1, $2, $3, $4, $5, $6)",
            name, hashed.digest, hashed.salt, hashed.n, hashed.r, hashed.p,
        )
    # create-user works without a writer, so on a database not migrated yet: no new twin there either.
    refused = create_user(cluster, "CAROL", PASSWORD)
    assert refused.returncode == 1 and "already exists" in refused.stderr, refused.stderr

    writer = cluster.writer()
    assert writer.wait_exit(60) == 78, writer.stderr  # a refusal (EX_CONFIG), not 69: no restart loop
    stderr = writer.stderr
    assert "Traceback" not in stderr, stderr
    (line,) = [line for line in stderr.splitlines() if "0012_account_names_folded.sql cannot be applied" in line]
    assert line.startswith("arkvory: migration 0012_account_names_folded.sql cannot be applied: ")
    assert "'ALICE' and 'Alice' and 'alice', 'BOB' and 'bob'" in line and "carol" not in line, line
    assert "UPDATE arkvory_accounts SET name" in line, line  # what to do, in the same line
    init = run_arkvory(cluster.base_env(ARKVORY_ROLE="api"), "admin", "init")
    assert init.returncode == 78 and "Traceback" not in init.stderr, init.stderr
    assert "'BOB' and 'bob'" in init.stderr
    assert db_fetch(url, "SELECT max(version) AS v FROM arkvory_schema_version")[0]["v"] == 11  # nothing half-done

    # The operator renames all but one of each; the writer then migrates and starts.
    db_execute(url, "UPDATE arkvory_accounts SET name = name || '-2' WHERE name IN ('BOB', 'Alice')")
    db_execute(url, "UPDATE arkvory_accounts SET name = 'alice-3' WHERE name = 'ALICE'")
    writer = cluster.writer().wait_ready()
    assert db_fetch(url, "SELECT max(version) AS v FROM arkvory_schema_version")[0]["v"] == db.CODE_SCHEMA_VERSION
    assert login(writer, "Alice").status_code == 200  # alice, in another spelling
    with pytest.raises(asyncpg.UniqueViolationError):  # the index holds whoever writes
        db_execute(url, "UPDATE arkvory_accounts SET name = 'CAROL' WHERE name = 'bob'")
