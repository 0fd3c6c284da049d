"""Fixtures for tests against a real SeaweedFS (shared/cli/seaweedfs.py): one store per session (per
xdist worker), a bucket per test. tests/conftest.py imports them for every module; a test module
must not import them itself (a fixture imported into a module is that module's own: a session
store of its own, running until the session ends).

Without a runnable `weed` (the seaweedfs extra not installed, another platform) these tests skip
and say why; any other failure to start the store is an error, not a skip.
"""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from arkvory.shared.cli.seaweedfs import SeaweedFS, start_seaweedfs

from .tools import require_weed


def weed_or_skip() -> None:
    require_weed()  # tests/tools.py: skips saying how to install it


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory) -> SeaweedFS:
    weed_or_skip()
    store = start_seaweedfs(tmp_path_factory.mktemp("s3"))
    yield store
    store.destroy()


@dataclasses.dataclass(frozen=True)
class Bucket:
    name: str
    store: SeaweedFS

    def environ(self, prefix: str = "") -> dict[str, str]:
        return self.store.environ(self.name, prefix)


@pytest.fixture
def s3_bucket(seaweedfs: SeaweedFS) -> Bucket:
    """A fresh bucket on the session's store (which is started again if a test killed it)."""
    if not seaweedfs.running:
        seaweedfs.start()
    name = f"t-{uuid.uuid4().hex[:16]}"
    seaweedfs.create_bucket(name)
    yield Bucket(name, seaweedfs)
    if not seaweedfs.running:
        seaweedfs.start()
    seaweedfs.delete_bucket(name)
