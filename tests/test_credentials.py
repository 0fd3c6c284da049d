"""Every credential kind on a writer and a gateway: reads of a private artifact, revocation and
expiry effective on the next request everywhere (caches included), last-used recorded by a
gateway."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from .harness import ADMIN_TOKEN, READER_TOKEN, db_fetch, eventually
from .test_accounts import make_account, session_of

pytestmark = pytest.mark.timeout(180)



@pytest.fixture(scope="module")
def site(module_cluster):
    """A writer and a gateway with the private repository `secret` and its artifact."""
    shared = module_cluster.shared_env()
    writer = module_cluster.writer(shared).wait_ready()
    gateway = module_cluster.gateway(1, shared).wait_ready()
    with writer.client(ADMIN_TOKEN) as admin:
        assert admin.post("/api/v1/repositories", json={"name": "secret"}).status_code == 201
        made = admin.post("/api/v1/repositories/secret/artifacts?name=a.bin", content=b"private bytes")
        assert made.status_code == 201, made.text
    return writer, gateway, f"/api/v1/repositories/secret/artifacts/{made.json()['id']}/content"


@pytest.fixture
def setup(site):
    """A credential of each kind, of the test's own account (read on `secret`) and its own
    managed key: a revocation or a disabled account in one test touches no other's."""
    writer, gateway, path = site
    account = f"alice-{uuid.uuid4().hex[:8]}"
    with writer.client(ADMIN_TOKEN) as admin:
        make_account(writer, account)
        assert admin.put(f"/api/v1/repositories/secret/permissions/{account}", json={"level": "read"}).status_code == 200
        key = admin.post("/api/v1/keys", json={"scopes": ["read:secret"], "label": "ci"})
        assert key.status_code == 201, key.text
    session = session_of(writer, account)
    with writer.client(session) as client:
        pat = client.post("/api/v1/tokens", json={"access": "read"})
        assert pat.status_code == 201, pat.text
    tokens = {
        "file key": READER_TOKEN,
        "managed key": key.json()["token"],
        "personal token": pat.json()["token"],
        "session": session,
    }
    ids = {"managed key": key.json()["id"], "personal token": pat.json()["id"], "account": account}
    return writer, gateway, path, tokens, ids


def get(process, token: str, path: str) -> httpx.Response:
    with process.client(token) as client:
        return client.get(path)


SECRET = "/api/v1/repositories/secret"  # a writer route: resolved by writer/request_inputs.principal_of
KINDS = ["file key", "managed key", "personal token", "session"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_credential_kind_reads_a_private_repository_on_the_writer(setup, kind):
    writer, gateway, _, tokens, _ = setup
    assert get(writer, tokens[kind], SECRET).status_code == 200
    assert get(writer, None, SECRET).status_code == 401
    # Every kind is a key for readiness on every process (shared/process/health.py uses the resolver).
    assert get(gateway, tokens[kind], "/health/ready").status_code == 200


def test_a_file_key_reads_the_artifact_through_the_writer_and_a_gateway(setup):
    writer, gateway, path, tokens, _ = setup
    for process in (writer, gateway):
        answer = get(process, tokens["file key"], path)
        assert answer.status_code == 200 and answer.content == b"private bytes"


@pytest.mark.parametrize("kind", ["managed key", "personal token", "session"])
def test_a_database_credential_reads_the_artifact_through_the_writer_and_a_gateway(setup, kind):
    writer, gateway, path, tokens, _ = setup
    for process in (writer, gateway):
        answer = get(process, tokens[kind], path)
        assert answer.status_code == 200 and answer.content == b"private bytes"


def refused_by_the_gateway(gateway, token, path: str) -> None:
    """A gateway learns of a revocation by the database's change notification (milliseconds
    after the writer's commit; measured 2-35 ms on a loaded machine): waited for, bounded. The
    writer itself refuses on its very next request, which the tests check without waiting."""
    eventually(lambda: get(gateway, token, path).status_code == 401, f"{path} refused by the gateway", timeout=5)


def _revoke(writer, kind, tokens, ids) -> None:
    if kind == "session":
        with writer.client(tokens[kind]) as client:
            assert client.post("/api/v1/logout").status_code == 204
        return
    route = "keys" if kind == "managed key" else "tokens"
    with writer.client(ADMIN_TOKEN) as admin:
        assert admin.delete(f"/api/v1/{route}/{ids[kind]}").status_code == 204


@pytest.mark.parametrize("kind", ["managed key", "personal token", "session"])
def test_a_revoked_credential_fails_on_the_next_request_on_every_process(setup, kind):
    writer, gateway, path, tokens, ids = setup
    token = tokens[kind]
    for _ in range(3):  # cached on both processes now
        assert get(writer, token, SECRET).status_code == 200
        assert get(gateway, token, "/health/ready").status_code == 200
    _revoke(writer, kind, tokens, ids)
    assert get(writer, token, SECRET).status_code == 401
    assert get(writer, token, path).status_code == 401
    assert get(writer, token, "/health/ready").status_code == 401
    refused_by_the_gateway(gateway, token, "/health/ready")
    assert get(gateway, token, path).status_code == 401


def test_an_expired_token_fails_on_the_next_request_on_every_process(setup):
    writer, gateway, path, tokens, _ = setup
    with writer.client(tokens["session"]) as client:
        short = client.post("/api/v1/tokens", json={"access": "read", "expiresInSeconds": 3})
    assert short.status_code == 201
    token = short.json()["token"]
    for _ in range(2):
        assert get(writer, token, SECRET).status_code == 200
        assert get(gateway, token, "/health/ready").status_code == 200
    # No notification comes for an expiry: the cached entry's own expiry must end it.
    time.sleep(3.3)
    assert get(writer, token, SECRET).status_code == 401
    assert get(gateway, token, "/health/ready").status_code == 401


def test_disabling_an_account_ends_its_credentials_on_a_gateway_too(setup):
    writer, gateway, _, tokens, ids = setup
    for kind in ("personal token", "session"):
        assert get(gateway, tokens[kind], "/health/ready").status_code == 200
    with writer.client(ADMIN_TOKEN) as admin:
        assert admin.post(f"/api/v1/accounts/{ids['account']}/disable").status_code == 200
    for kind in ("personal token", "session"):
        refused_by_the_gateway(gateway, tokens[kind], "/health/ready")


def test_last_used_is_recorded_in_batches_also_by_a_gateway(setup, module_database_url):
    _, gateway, _, tokens, ids = setup
    with gateway.client(tokens["managed key"]) as client:
        for _ in range(30):
            assert client.get("/health/ready").status_code == 200
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = db_fetch(module_database_url, "SELECT last_used_at FROM arkvory_credentials WHERE id = $1::uuid", ids["managed key"])
        if row[0]["last_used_at"] is not None:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the gateway never recorded the key's last use")
    with setup[0].client(ADMIN_TOKEN) as admin:
        listed = admin.get("/api/v1/keys")
    item = [i for i in listed.json()["items"] if i["id"] == ids["managed key"]][0]
    assert item["lastUsedAt"] is not None and "token" not in item


def test_remembered_credentials_end_on_the_next_download_when_revoked_or_expired(setup):
    """A gateway answers small downloads from credentials it remembers (by a digest of the
    token): a revocation ends that on an open keep-alive connection as soon as the notification comes,
    and so does the credential's own expiry, for which no notification comes."""
    writer, gateway, path, tokens, ids = setup
    with writer.client(tokens["session"]) as client:
        short = client.post("/api/v1/tokens", json={"access": "read", "expiresInSeconds": 3})
    assert short.status_code == 201, short.text
    expires = time.monotonic() + 3
    with gateway.client(tokens["managed key"]) as revoked, gateway.client(short.json()["token"]) as expiring:
        for _ in range(5):  # one connection each, remembered after the first request
            for client in (revoked, expiring):
                answer = client.get(path)
                assert answer.status_code == 200 and answer.content == b"private bytes"
        _revoke(writer, "managed key", tokens, ids)
        assert get(writer, tokens["managed key"], path).status_code == 401
        # The same keep-alive connection, once the change notification reached the gateway.
        eventually(lambda: revoked.get(path).status_code == 401, "the revoked key refused", timeout=5)
        assert expiring.get(path).status_code == 200  # a revocation ends only its own credential
        time.sleep(max(0.0, expires - time.monotonic()) + 0.3)
        assert expiring.get(path).status_code == 401
