"""Gateways remember content lookups, and forget them as soon as the catalog changes."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from .harness import db_execute

pytestmark = pytest.mark.timeout(120)


def metric(process, name: str) -> float:
    with process.client() as client:
        for line in client.get("/health/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


def eventually(check, timeout: float = 2.0):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.05)


@pytest.fixture(scope="module")
def processes(module_cluster):
    """One writer and gateway for the module: each test makes a repository of its own."""
    shared = module_cluster.shared_env()
    writer = module_cluster.writer(shared).wait_ready()
    return writer, module_cluster.gateway(1, shared).wait_ready()


@pytest.fixture
def site(processes):
    """A public repository of the test's own, with two artifacts and the asset `latest`."""
    writer, gateway = processes
    repo = f"cache-{uuid.uuid4().hex[:8]}"
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": repo, "public": True}).status_code == 201
        first = client.post(f"/api/v1/repositories/{repo}/artifacts", params={"name": "a"}, content=b"first").json()
        second = client.post(f"/api/v1/repositories/{repo}/artifacts", params={"name": "b"}, content=b"second").json()
        client.put(f"/api/v1/repositories/{repo}/assets", params={"path": "latest"}, json={"artifactId": first["id"]})
    return writer, gateway, first, second, repo


def hits(gateway) -> float:
    """The gateway's cache hits so far (the counter appears with its first hit)."""
    try:
        return metric(gateway, 'arkvory_catalog_lookups_total{result="hit"}')
    except AssertionError:
        return 0.0


def test_repeated_downloads_are_answered_from_the_cache(site):
    writer, gateway, first, _, repo = site
    path = f"/api/v1/repositories/{repo}/artifacts/{first['id']}/content"
    before = hits(gateway)
    with gateway.client() as client:
        assert client.get(path).content == b"first"
        assert client.get(path).content == b"first"
    assert hits(gateway) - before == 1


def test_repointed_asset_is_seen_at_once_on_the_gateway(site):
    writer, gateway, first, second, repo = site
    asset = f"/api/v1/repositories/{repo}/asset/content"
    with gateway.client() as client:
        assert client.get(asset, params={"path": "latest"}).content == b"first"
    with writer.client() as client:
        client.put(f"/api/v1/repositories/{repo}/assets", params={"path": "latest"}, json={"artifactId": second["id"]})
        # The writer's own next request already sees it.
        assert client.get(asset, params={"path": "latest"}).content == b"second"
    with gateway.client() as client:
        assert eventually(
            lambda: client.get(asset, params={"path": "latest"}).content == b"second",
            timeout=1.0,
        )


def test_repository_made_private_is_refused_to_anonymous_at_once(site):
    writer, gateway, first, _, repo = site
    path = f"{gateway.url}/api/v1/repositories/{repo}/artifacts/{first['id']}/content"
    assert httpx.get(path).status_code == 200
    with writer.client() as client:
        assert client.patch(f"/api/v1/repositories/{repo}", json={"public": False}).status_code == 200
    assert eventually(lambda: httpx.get(path).status_code == 401, timeout=1.0)


def test_a_change_made_by_sql_also_reaches_the_gateway(site, module_cluster):
    writer, gateway, first, _, repo = site
    path = f"{gateway.url}/api/v1/repositories/{repo}/artifacts/{first['id']}/content"
    assert httpx.get(path).status_code == 200
    db_execute(module_cluster.database_url, "UPDATE arkvory_repositories SET public = false WHERE name = $1", repo)
    assert eventually(lambda: httpx.get(path).status_code == 401, timeout=1.0)


def test_no_cached_answer_while_the_listener_is_gone_and_caching_after_it_is_back(database_url):
    """The control connection's backend dies: from that moment nothing is answered from memory
    (a change in the gap would go unseen); once it re-LISTENs, caching works again."""
    import asyncio

    import anyio

    from arkvory.shared import db
    from arkvory.shared.download.catalog_cache import CatalogCache
    from arkvory.shared.cluster.control import ControlConnection

    async def scenario():
        setup = await db.connect(database_url)
        await db.migrate(setup)
        cache = CatalogCache()
        control = ControlConnection(database_url, "test")
        control.subscribe(
            cache.channel, cache.notified, on_listening=cache.started_listening, on_deaf=cache.stop_listening
        )
        await control.open()
        await control.listen()
        cache.put("key", "value", cache.generation)
        assert cache.get("key") == "value"
        # The backend dies before the supervisor runs, so the gap can be looked at.
        await setup.execute("SELECT pg_terminate_backend($1)", control.conn.get_server_pid())
        async with asyncio.timeout(5):
            while cache.listening:
                await asyncio.sleep(0.01)
        assert cache.get("key") is None
        cache.put("key", "stale", cache.generation)
        assert cache.get("key") is None  # nothing is remembered while nobody listens
        async with anyio.create_task_group() as tg:
            await tg.start(control.run)
            async with asyncio.timeout(10):
                while not cache.listening:
                    await asyncio.sleep(0.05)
            assert control.reconnects == 1
            cache.put("key", "fresh", cache.generation)
            assert cache.get("key") == "fresh"
            # Notifications arrive on the new connection.
            await setup.execute("NOTIFY arkvory_catalog, 'arkvory_repositories'")
            async with asyncio.timeout(5):
                while cache.get("key") is not None:
                    await asyncio.sleep(0.01)
            tg.cancel_scope.cancel()
        await control.close()
        await setup.close()

    asyncio.run(scenario())
