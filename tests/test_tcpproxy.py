"""TcpProxy between asyncpg and a real PostgreSQL: it forwards, stalls, resumes and cuts."""

from __future__ import annotations

import asyncio
import socket
import time

import asyncpg
import pytest

from arkvory.shared.cli.localpg import start_local_postgres
from .tcpproxy import TcpProxy


@pytest.fixture(scope="module")
def database_url(module_tmp_path):
    postgres = start_local_postgres(module_tmp_path, fsync=False, environ={})
    yield postgres.url
    postgres.destroy()  # stop() would leave its data (39 MB) behind


@pytest.fixture
def proxy(database_url: str):
    with TcpProxy.for_url(database_url) as proxy:
        yield proxy


@pytest.mark.timeout(120)
def test_url_for_replaces_only_host_and_port(proxy: TcpProxy) -> None:
    url = proxy.url_for("postgresql://app:pw@db.example:6543/arkvory?sslmode=disable")
    assert url == f"postgresql://app:pw@127.0.0.1:{proxy.port}/arkvory?sslmode=disable"


@pytest.mark.timeout(120)
def test_queries_pass_through(proxy: TcpProxy, database_url: str) -> None:
    async def scenario() -> None:
        connection = await asyncpg.connect(proxy.url_for(database_url), timeout=10)
        try:
            assert await connection.fetchval("select 1", timeout=10) == 1
            # Larger than one chunk in each direction.
            big = "x" * 1_000_000
            sent = await connection.fetchval("select length($1::text)", big, timeout=10)
            upstream, downstream = proxy.sent_upstream, proxy.sent_downstream
            received = await connection.fetchval("select repeat('y', 1000000)", timeout=10)
            assert (sent, len(received)) == (len(big), len(big))
            # Each way counted: the big query went up, the big answer came down.
            assert upstream > len(big) and proxy.sent_upstream - upstream < 1000
            assert proxy.sent_downstream - downstream > len(big)
        finally:
            await connection.close(timeout=10)

    asyncio.run(scenario())


@pytest.mark.timeout(120)
def test_a_stall_times_queries_out_and_resume_lets_new_connections_work(
    proxy: TcpProxy, database_url: str
) -> None:
    url = proxy.url_for(database_url)

    async def scenario() -> None:
        stalled = await asyncpg.connect(url, timeout=10)
        try:
            proxy.stall()
            with pytest.raises(TimeoutError):
                await stalled.fetchval("select 1", timeout=1)
            with pytest.raises(TimeoutError):
                await asyncpg.connect(url, timeout=1)

            proxy.resume()
            fresh = await asyncpg.connect(url, timeout=10)
            try:
                assert await fresh.fetchval("select 2", timeout=10) == 2
            finally:
                await fresh.close(timeout=10)
        finally:
            stalled.terminate()

    asyncio.run(scenario())


@pytest.mark.timeout(120)
def test_a_stall_keeps_the_sockets_open(proxy: TcpProxy) -> None:
    proxy.stall()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
        client.sendall(b"anything")
        client.settimeout(0.5)
        with pytest.raises(TimeoutError):  # no data and no EOF: the peer is just silent
            client.recv(1)


@pytest.mark.timeout(120)
def test_cut_closes_current_connections_only(proxy: TcpProxy, database_url: str) -> None:
    url = proxy.url_for(database_url)

    async def scenario() -> None:
        victim = await asyncpg.connect(url, timeout=10)
        try:
            proxy.cut()
            lost = (asyncpg.ConnectionDoesNotExistError, asyncpg.InterfaceError, OSError)
            with pytest.raises(lost):
                await victim.fetchval("select 1", timeout=10)
        finally:
            victim.terminate()

        survivor = await asyncpg.connect(url, timeout=10)
        try:
            assert await survivor.fetchval("select 3", timeout=10) == 3
        finally:
            await survivor.close(timeout=10)

    asyncio.run(scenario())


@pytest.mark.timeout(120)
def test_stop_is_prompt_with_stalled_connections_and_idempotent(database_url: str) -> None:
    proxy = TcpProxy.for_url(database_url).start()
    port = proxy.port
    proxy.stall()
    clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
    try:
        began = time.monotonic()
        proxy.stop()
        proxy.stop()
        assert time.monotonic() - began < 2
        for client in clients:
            client.settimeout(5)
            try:  # closed by the proxy, or reset by the kernel if it was never accepted
                assert client.recv(1) == b""
            except ConnectionResetError:
                pass
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        for client in clients:
            client.close()


@pytest.mark.timeout(120)
def test_refuse_closes_every_connection_at_once_until_resume(proxy: TcpProxy, database_url: str) -> None:
    url = proxy.url_for(database_url)
    lost = (asyncpg.ConnectionDoesNotExistError, asyncpg.InterfaceError, OSError)

    async def scenario() -> None:
        victim = await asyncpg.connect(url, timeout=10)
        try:
            proxy.refuse()
            with pytest.raises(lost):
                await victim.fetchval("select 1", timeout=10)
        finally:
            victim.terminate()
        began = time.monotonic()
        with pytest.raises(lost):  # a stopped server: no waiting for a timeout
            await asyncpg.connect(url, timeout=10)
        assert time.monotonic() - began < 2

        proxy.resume()
        fresh = await asyncpg.connect(url, timeout=10)
        try:
            assert await fresh.fetchval("select 4", timeout=10) == 4
        finally:
            await fresh.close(timeout=10)

    asyncio.run(scenario())
