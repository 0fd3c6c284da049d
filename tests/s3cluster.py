"""Real `arkvory serve` processes whose blobs live on a real SeaweedFS (tests/s3store.py): as on
several hosts, each process may bind its own loopback address (Linux routes all of 127/8 to lo)
and keep its own ARKVORY_DATA_DIR, so they share nothing but the database and the bucket. Its
fixture `s3_cluster` comes to every module through tests/conftest.py (see tests/s3store.py).
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import socket

import httpx
import pytest

from arkvory.shared.settings import Settings
from arkvory.shared.storage.s3 import ObjectStorage, blob_key
from arkvory.shared.storage.s3_client import ObjectStore

from .harness import ADMIN_TOKEN, ArkvoryProcess, Cluster, free_port
from .s3store import Bucket, s3_bucket, seaweedfs  # noqa: F401  (pytest fixtures)

# Two hosts of the scenario, as loopback addresses of their own.
GATEWAY_HOSTS = ("127.0.0.2", "127.0.0.3")


def loopback_aliases_or_skip(*hosts: str) -> None:
    """Skip (saying why) when this machine cannot bind 127.0.0.x beyond 127.0.0.1."""
    for host in hosts:
        with socket.socket() as probe:
            try:
                probe.bind((host, 0))
            except OSError as exc:
                pytest.skip(f"cannot bind {host} here ({exc.strerror}): the loopback has no 127/8 route")


class HostedProcess(ArkvoryProcess):
    """An `arkvory serve` reached at its own ARKVORY_HOST rather than 127.0.0.1."""

    def __init__(self, name: str, env: dict[str, str], workdir: pathlib.Path) -> None:
        super().__init__(name, env, workdir)
        self.url = f"http://{env['ARKVORY_HOST']}:{self.port}"

    def ready(self) -> dict:
        return httpx.get(
            f"{self.url}/health/ready", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=5
        ).json()


class S3Cluster(Cluster):
    """Processes against one database and one bucket (and prefix); every process's local state
    is its own directory unless given one."""

    def __init__(self, database_url: str, workdir: pathlib.Path, bucket: Bucket, prefix: str = "inst") -> None:
        super().__init__(database_url, workdir)
        self.bucket = bucket
        self.prefix = prefix

    @property
    def secret(self) -> str:
        return self.bucket.store.credentials.secret_access_key

    def base_env(self, **overrides: str) -> dict[str, str]:
        env = super().base_env()
        env.pop("AWS_REGION", None)
        env.update(self.bucket.environ(self.prefix))
        env.update(overrides)
        return {k: v for k, v in env.items() if v is not None}

    def start(self, name: str = "arkvory", **env: str) -> HostedProcess:
        env.setdefault("ARKVORY_PORT", str(free_port()))
        process = HostedProcess(name, self.base_env(**env), self.workdir)
        self.processes.append(process)
        return process

    def gateway(self, slot: int, shared: dict[str, str], host: str = "127.0.0.1", **env: str) -> HostedProcess:
        """A gateway on `host` with a local state directory of its own (another host's disk)."""
        env.setdefault("ARKVORY_DATA_DIR", str(self.workdir / f"gateway{slot}-local"))
        return super().gateway(slot, shared, ARKVORY_HOST=host, **env)  # type: ignore[return-value]

    # -- the bucket, seen from outside ----------------------------------------------------------

    def settings(self) -> Settings:
        return Settings.from_env(self.base_env())

    def object_store(self) -> ObjectStore:
        settings = self.settings().object_store
        assert settings is not None
        return ObjectStore(settings, connect_timeout=2.0, read_timeout=10.0)

    def storage(self) -> ObjectStorage:
        settings = self.settings()
        assert settings.object_store is not None
        return ObjectStorage(settings.data_dir, settings.object_store, self.object_store())

    def object_keys(self) -> list[str]:
        async def keys() -> list[str]:
            found = []
            async for page in self.object_store().list():
                found += [item.key for item in page]
            return found

        return asyncio.run(keys())

    def has_blob(self, sha256: str) -> bool:
        return blob_key(sha256) in self.object_keys()

    def put_object(self, key: str, data: bytes) -> None:
        """Write an object (`key` under the prefix) straight into the bucket, without metadata,
        as a person or a bug would."""
        import obstore

        async def put() -> None:
            store = self.object_store()
            await obstore.put_async(store._store, store._full(key), data)

        asyncio.run(put())

    # -- no credential anywhere -----------------------------------------------------------------

    def assert_secret_nowhere(self, *documents: object) -> None:
        """The secret key appears in no process's stderr and in none of `documents` (readiness
        JSON, metrics text...)."""
        secret = self.secret
        for process in self.processes:
            text = process.stderr_path.read_text(errors="replace") if process.stderr_path.exists() else ""
            assert secret not in text, f"{process.name}'s stderr shows the secret key"
        for document in documents:
            text = document if isinstance(document, str) else json.dumps(document)
            assert secret not in text, "a document shows the secret key"


@pytest.fixture
def s3_cluster(database_url, tmp_path, s3_bucket: Bucket):  # noqa: F811
    group = S3Cluster(database_url, tmp_path, s3_bucket)
    yield group
    try:
        group.assert_secret_nowhere()
    finally:
        group.close()
