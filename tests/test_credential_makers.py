"""Credentials never outlive their maker (issue 22, SPEC §5), on a writer and a gateway: a token
or key made through a session without the password ends with that session (logout, a password
change); made with the password given again it outlives the session but not the account; a
managed key made by an account is suspended when the account is disabled, cannot re-enable it,
and works again once an administrator adopts it. Also what migration 0014 makes of older rows."""

from __future__ import annotations

import asyncio
import datetime
import uuid

import asyncpg
import httpx
import pytest

from arkvory.shared import db

from .console_client import Console, messages
from .harness import ADMIN_TOKEN, eventually
from .test_accounts import PASSWORD, login, make_account
from .test_credentials import site  # noqa: F401  (a writer and a gateway, and `secret`'s artifact)

pytestmark = pytest.mark.timeout(180)

YEAR = 366 * 86400


def new_account(writer, admin: bool = False) -> str:
    """An account of the test's own (one test's disable touches no other's) that reads `secret`."""
    name = f"u-{uuid.uuid4().hex[:8]}"
    make_account(writer, name, admin=admin)
    with writer.client(ADMIN_TOKEN) as client:
        granted = client.put(f"/api/v1/repositories/secret/permissions/{name}", json={"level": "read"})
    assert granted.status_code == 200, granted.text
    return name


def signed_in(writer, name: str) -> tuple[str, str]:
    """(session token, session id)"""
    answer = login(writer, name)
    assert answer.status_code == 200, answer.text
    return answer.json()["token"], answer.json()["sessionId"]


def make(writer, credential: str, route: str = "tokens", **body) -> dict:
    with writer.client(credential) as client:
        answer = client.post(f"/api/v1/{route}", json=body)
    assert answer.status_code == 201, answer.text
    return answer.json()


def expiry(made: dict) -> datetime.datetime:
    return datetime.datetime.fromisoformat(made["expiresAt"])


def answers(process, path: str, *credentials: dict | str) -> set[int]:
    """What `process` answers each credential's download of the artifact."""
    seen = set()
    for credential in credentials:
        with process.client(credential if isinstance(credential, str) else credential["token"]) as client:
            seen.add(client.get(path).status_code)
    return seen


def works(site, *credentials) -> None:
    writer, gateway, path = site
    # Twice: the second answer comes from what each process now remembers, which a revocation
    # or a suspension must flush.
    for _ in range(2):
        assert answers(writer, path, *credentials) == answers(gateway, path, *credentials) == {200}


def refused(site, *credentials) -> None:
    """Refused by the writer at its next request, and by the gateway once the change's NOTIFY
    reached it (a few milliseconds: harness.eventually); without it, forever."""
    writer, gateway, path = site
    assert answers(writer, path, *credentials) == {401}
    eventually(lambda: answers(gateway, path, *credentials) == {401}, "refused by the gateway", timeout=5)


def admin_post(writer, path: str, **body) -> httpx.Response:
    with writer.client(ADMIN_TOKEN) as client:
        return client.post(path, json=body or None)


def account_disabled(writer, name: str) -> bool:
    with writer.client(ADMIN_TOKEN) as client:
        listed = client.get("/api/v1/accounts", params={"limit": 1000}).json()["items"]
    return [a for a in listed if a["name"] == name][0]["disabled"]


def key_listed(writer, key_id: str) -> dict:
    with writer.client(ADMIN_TOKEN) as client:
        listed = client.get("/api/v1/keys", params={"limit": 1000}).json()["items"]
    return [k for k in listed if k["id"] == key_id][0]


def test_a_token_made_through_a_session_is_refused_everywhere_after_logout(site):
    writer = site[0]
    session, session_id = signed_in(writer, new_account(writer))
    token = make(writer, session, access="read-write", label="ci", expiresInSeconds=YEAR)
    child = make(writer, token["token"], access="read", expiresInSeconds=YEAR)  # made by that token
    assert (token["madeThrough"], token["passwordGiven"], token["endsWith"]) == (f"session:{session_id}", False, session_id)
    assert (child["madeThrough"], child["endsWith"]) == (f"pat:{token['id']}", token["id"])
    assert expiry(child) <= expiry(token) <= datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)
    works(site, token, child)
    with writer.client(session) as client:
        assert client.post("/api/v1/logout").status_code == 204
    refused(site, token, child)


def test_a_token_made_by_a_token_is_revoked_with_it(site):
    writer = site[0]
    session, _ = signed_in(writer, new_account(writer))
    parent = make(writer, session, access="read-write", password=PASSWORD, expiresInSeconds=YEAR)
    child = make(writer, parent["token"], access="read", expiresInSeconds=YEAR)
    assert expiry(child) <= expiry(parent) and child["endsWith"] == parent["id"]
    works(site, parent, child)
    with writer.client(session) as client:
        assert client.delete(f"/api/v1/tokens/{parent['id']}").status_code == 204
    refused(site, parent, child)


def test_a_token_made_with_the_password_outlives_its_session_but_not_its_account(site):
    writer = site[0]
    name = new_account(writer)
    session, session_id = signed_in(writer, name)
    token = make(writer, session, access="read", password=PASSWORD, expiresInSeconds=YEAR)
    assert (token["madeThrough"], token["passwordGiven"], token["endsWith"]) == (f"session:{session_id}", True, None)
    assert token["makerAccount"] == name
    with writer.client(session) as client:
        assert client.post("/api/v1/logout").status_code == 204
    works(site, token)
    assert admin_post(writer, f"/api/v1/accounts/{name}/disable").status_code == 200
    refused(site, token)
    assert admin_post(writer, f"/api/v1/accounts/{name}/enable").status_code == 200
    refused(site, token)  # ended, not suspended: enabling the account again does not bring it back


def test_a_password_change_ends_what_the_other_sessions_made(site):
    writer = site[0]
    name = new_account(writer)
    (first, _), (second, _) = signed_in(writer, name), signed_in(writer, name)
    through_first = make(writer, first, access="read")
    with_password = make(writer, first, access="read", password=PASSWORD)
    through_second = make(writer, second, access="read")
    with writer.client(second) as client:
        changed = client.post("/api/v1/account/password", json={"oldPassword": PASSWORD, "newPassword": PASSWORD + "!"})
    assert changed.status_code == 204, changed.text
    refused(site, first, through_first)
    works(site, with_password, through_second)


def test_a_key_made_by_a_stolen_session_is_suspended_with_its_maker_and_works_again_once_adopted(site):
    """The attack: a stolen administrator's session makes an admin key, which outlived the
    logout and the disabling of its maker and re-enabled the account."""
    writer = site[0]
    victim = new_account(writer, admin=True)
    stolen, stolen_id = signed_in(writer, victim)
    key = make(writer, stolen, "keys", scopes=["admin"], label="not mine", expiresInSeconds=YEAR)
    spawned = make(writer, key["token"], "keys", scopes=["read:secret"])  # made by that key: the victim answers
    assert (key["makerAccount"], key["madeThrough"], key["endsWith"]) == (victim, f"session:{stolen_id}", stolen_id)
    assert (spawned["makerAccount"], spawned["endsWith"]) == (victim, key["id"])
    works(site, key, spawned)

    assert admin_post(writer, f"/api/v1/accounts/{victim}/disable").status_code == 200
    refused(site, key, spawned)
    with writer.client(key["token"]) as client:
        assert client.post(f"/api/v1/accounts/{victim}/enable").status_code == 401
    assert account_disabled(writer, victim)
    listed = key_listed(writer, key["id"])
    assert listed["suspendedAt"] is not None and listed["endsWith"] is None  # kept for adoption

    rescuer = new_account(writer, admin=True)
    session, session_id = signed_in(writer, rescuer)
    with writer.client(session) as client:
        wrong = client.post(f"/api/v1/keys/{key['id']}/adopt", json={"password": "not the password"})
        assert wrong.status_code == 401
        adopted = client.post(f"/api/v1/keys/{key['id']}/adopt", json={"password": PASSWORD})
        assert adopted.status_code == 200, adopted.text
        again = client.post(f"/api/v1/keys/{key['id']}/adopt", json={})
        assert again.status_code == 409 and again.json()["code"] == "conflict"
    body = adopted.json()
    assert (body["makerAccount"], body["madeThrough"], body["passwordGiven"]) == (rescuer, f"session:{session_id}", True)
    assert body["suspendedAt"] is None and body["endsWith"] is None and "token" not in body
    works(site, key)
    refused(site, spawned)  # each suspended key is adopted on its own
    assert account_disabled(writer, victim)
    with writer.client(session) as client:
        assert client.post("/api/v1/logout").status_code == 204
    works(site, key)  # adopted with the password: it outlives the adopter's session


def test_a_key_adopted_without_the_password_ends_with_the_adopters_session(site):
    writer = site[0]
    maker = new_account(writer, admin=True)
    session, _ = signed_in(writer, maker)
    key = make(writer, session, "keys", scopes=["read:secret"], password=PASSWORD, expiresInSeconds=YEAR)
    with writer.client(session) as client:
        assert client.post("/api/v1/logout").status_code == 204
    works(site, key)  # made with the password: it outlived the session
    assert admin_post(writer, f"/api/v1/accounts/{maker}/disable").status_code == 200
    refused(site, key)

    adopter, adopter_id = signed_in(writer, new_account(writer, admin=True))
    with writer.client(adopter) as client:
        headers = {"Idempotency-Key": f"adopt-{key['id']}"}
        adopted = client.post(f"/api/v1/keys/{key['id']}/adopt", json={}, headers=headers)
        replayed = client.post(f"/api/v1/keys/{key['id']}/adopt", json={}, headers=headers)
    assert adopted.status_code == 200, adopted.text
    assert replayed.status_code == 200 and replayed.headers["idempotent-replayed"] == "true"
    assert adopted.json()["endsWith"] == adopter_id and expiry(adopted.json()) < expiry(key)
    works(site, key)
    with writer.client(adopter) as client:
        assert client.post("/api/v1/logout").status_code == 204
    refused(site, key)


def test_what_a_keys_file_key_makes_has_no_maker_account_and_adoption_is_for_suspended_keys(site):
    writer = site[0]
    key = make(writer, ADMIN_TOKEN, "keys", scopes=["read:secret"])
    assert (key["makerAccount"], key["madeThrough"], key["endsWith"]) == (None, "keys_file:admin", None)
    assert admin_post(writer, f"/api/v1/keys/{key['id']}/adopt").status_code == 400  # the body is a JSON object
    assert admin_post(writer, f"/api/v1/keys/{key['id']}/adopt", password=PASSWORD).status_code == 400  # a key has none
    with writer.client(ADMIN_TOKEN) as admin:
        assert admin.post(f"/api/v1/keys/{key['id']}/adopt", json={}).status_code == 409
        assert admin.post(f"/api/v1/keys/{uuid.uuid4()}/adopt", json={}).status_code == 404
        assert admin.post("/api/v1/keys/not-a-uuid/adopt", json={}).status_code == 400
    user, _ = signed_in(writer, new_account(writer))
    with writer.client(user) as client:
        assert client.post(f"/api/v1/keys/{key['id']}/adopt", json={}).status_code == 403
    works(site, key)


def test_a_key_cannot_undo_a_disable_that_commits_while_it_asks(site, module_database_url):
    """The race the suspension alone leaves: the key is resolved (valid) before the disable
    commits, and its enable then waits for the disable's lock on the account row."""
    writer = site[0]
    victim = new_account(writer, admin=True)
    session, _ = signed_in(writer, victim)
    key = make(writer, session, "keys", scopes=["admin"], password=PASSWORD)
    works(site, key)

    async def race() -> tuple[int, int]:
        blocker = await asyncpg.connect(module_database_url)
        try:
            held = blocker.transaction()
            await held.start()
            # The lock an UPDATE of the row takes, as a disable still running would hold it (FOR
            # UPDATE would also stop every foreign-key check on the row meanwhile).
            await blocker.execute("SELECT 1 FROM arkvory_accounts WHERE name = $1 FOR NO KEY UPDATE", victim)
            async with httpx.AsyncClient(base_url=writer.url, timeout=30) as client:
                disable = asyncio.ensure_future(client.post(
                    f"/api/v1/accounts/{victim}/disable", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}))
                await _until_waiting(blocker, 1)
                enable = asyncio.ensure_future(client.post(
                    f"/api/v1/accounts/{victim}/enable", headers={"Authorization": f"Bearer {key['token']}"}))
                await _until_waiting(blocker, 2)  # queued behind the disable
                await held.rollback()
                return (await disable).status_code, (await enable).status_code
        finally:
            await blocker.close()

    assert asyncio.run(race()) == (200, 401)
    assert account_disabled(writer, victim)
    refused(site, key)


async def _until_waiting(conn: asyncpg.Connection, count: int, timeout: float = 3.0) -> None:
    """Until `count` statements of this database wait for a lock (the account's row: nothing else
    is locked), well under the writer's 5 s statement timeout. Counted by pg_blocking_pids, not
    by their query text (a statement waiting at its start may still show its BEGIN), on a fresh
    look each time (`conn` is in a transaction, which would see one snapshot of the activity)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        waiting = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND cardinality(pg_blocking_pids(pid)) > 0"
        )
        if waiting >= count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{count} requests never waited for the account's row")


def test_the_migration_records_what_older_rows_say_and_suspends_keys_of_disabled_accounts(database_url):
    """The migration on rows made before it: makers from created_by, a key made by a key tied to
    it, a key made by an account disabled already suspended; nothing revoked."""

    async def upgrade() -> dict[str, dict]:
        conn = await asyncpg.connect(database_url)
        try:
            # Found by name: its number is wherever the branches' merges put it.
            (makers,) = [(v, sql) for v, name, sql in db.migrations() if name.endswith("_credential_makers.sql")]
            for _, _, sql in db.migrations()[:makers[0] - 1]:
                await conn.execute(sql)
            gone, kept = uuid.uuid4(), uuid.uuid4()
            for account, disabled in ((gone, True), (kept, False)):
                await conn.execute(
                    "INSERT INTO arkvory_accounts (id, name, password_hash, password_salt, scrypt_n, scrypt_r,"
                    " scrypt_p, disabled) VALUES ($1, $2, '', '', 1, 1, 1, $3)", account, account.hex[:8], disabled)
            rows = {"by gone": f"account:{gone}", "by kept": f"account:{kept}", "by file": "key:ci"}
            ids = {name: uuid.uuid4() for name in (*rows, "by key", "token")}
            rows["by key"] = f"service:{ids['by gone']}"
            for name, created_by in rows.items():
                await conn.execute(
                    "INSERT INTO arkvory_credentials (id, kind, digest, scopes, created_by, expires_at)"
                    " VALUES ($1, 'service_key', $2, '{admin}', $3, now() + interval '1 day')",
                    ids[name], uuid.uuid4().bytes * 2, created_by)
            await conn.execute(
                "INSERT INTO arkvory_credentials (id, kind, digest, account_id, access, created_by, expires_at)"
                " VALUES ($1, 'pat', $2, $3, 'read', $4, now() + interval '1 day')",
                ids["token"], uuid.uuid4().bytes * 2, kept, f"account:{kept}")
            await conn.execute(makers[1])
            found = await conn.fetch(
                "SELECT id, maker_account_id, made_through, password_given, ends_with, suspended_at"
                " FROM arkvory_credentials")
            by_id = {row["id"]: dict(row) for row in found}
            return {name: by_id[ids[name]] for name in ids} | {"ids": ids, "gone": gone, "kept": kept}
        finally:
            await conn.close()

    rows = asyncio.run(upgrade())
    ids, gone, kept = rows["ids"], rows["gone"], rows["kept"]
    assert rows["by gone"]["maker_account_id"] == gone and rows["by gone"]["suspended_at"] is not None
    assert rows["by gone"]["made_through"] is None and rows["by gone"]["ends_with"] is None  # which session: unknown
    by_key = rows["by key"]
    assert (by_key["maker_account_id"], by_key["ends_with"], by_key["made_through"], by_key["password_given"]) == (
        gone, ids["by gone"], f"service_key:{ids['by gone']}", False)
    assert by_key["suspended_at"] is not None
    assert rows["by kept"]["maker_account_id"] == kept and rows["by kept"]["suspended_at"] is None
    assert (rows["by file"]["maker_account_id"], rows["by file"]["made_through"]) == (None, "keys_file:ci")
    assert rows["token"]["maker_account_id"] == kept and rows["token"]["ends_with"] is None
    assert rows["token"]["password_given"] is None


# -- the console --------------------------------------------------------------------------------------


def _secret(page: httpx.Response) -> str:
    assert page.status_code == 201, page.text
    return page.text.split('id="new-secret" readonly value="', 1)[1].split('"', 1)[0]


def test_the_console_ends_what_a_session_made_at_sign_out_and_adopts_a_suspended_key(site):
    writer = site[0]
    maker, rescuer = new_account(writer, admin=True), new_account(writer, admin=True)
    with Console(writer.url) as console:
        console.signed_in(maker, PASSWORD)
        tied = _secret(console.submit("/console/keys", "/console/keys", scopes="read:secret", label="tied"))
        kept = _secret(console.submit("/console/keys", "/console/keys", scopes="read:secret", label=f"kept by {maker}",
                                      password=PASSWORD))
        token = _secret(console.submit("/console/tokens", "/console/tokens", access="read", label="tied"))
        works(site, tied, kept, token)
        assert console.submit("/console/", "/console/sign-out").status_code == 303
    refused(site, tied, token)  # made through the console's session without the password
    works(site, kept)
    assert admin_post(writer, f"/api/v1/accounts/{maker}/disable").status_code == 200
    refused(site, kept)

    with Console(writer.url) as console:
        console.signed_in(rescuer, PASSWORD)
        key_id = _id_of(writer, f"kept by {maker}")
        row = console.get("/console/keys").text.split(f'data-key="{key_id}"', 1)[1].split("</tr>", 1)[0]
        assert 'data-suspended="true"' in row and ">Adopt</button>" in row
        not_yours = console.submit("/console/keys", f"/console/keys/{key_id}/adopt", password="not the password")
        assert not_yours.status_code == 401 and messages(not_yours) == ["the password is wrong"]
        adopted = console.submit("/console/keys", f"/console/keys/{key_id}/adopt", password=PASSWORD)
        assert adopted.status_code == 303 and adopted.headers["location"] == "/console/keys?notice=key-adopted"
        works(site, kept)
        again = console.submit("/console/keys", f"/console/keys/{key_id}/adopt")
        assert again.status_code == 409 and "is not suspended" in messages(again)[0]
        for hostile in ("not-a-uuid", "..", "%2e%2e"):
            assert console.submit("/console/keys", f"/console/keys/{hostile}/adopt").status_code in (400, 404)
        forged = console.http.post(f"/console/keys/{key_id}/adopt", data={"password": PASSWORD})
        assert forged.status_code == 403  # no CSRF token
        assert console.submit("/console/", "/console/sign-out").status_code == 303
    works(site, kept)  # adopted with the password: it outlived the rescuer's session


def _id_of(writer, label: str) -> str:
    with writer.client(ADMIN_TOKEN) as client:
        listed = client.get("/api/v1/keys", params={"limit": 1000}).json()["items"]
    return [k for k in listed if k["label"] == label][0]["id"]
