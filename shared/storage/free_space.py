"""The free space where this process writes on its own disk (issue 24 item 3): uploads under
ARKVORY_DATA_DIR and the read cache, read with statvfs at scrape time (microseconds a directory,
so no loop and nothing on the serving path):

    arkvory_disk_free_bytes{dir, path}   bytes an unprivileged writer may still use there: what
                                         an upload checks against ARKVORY_MIN_FREE_BYTES
    arkvory_disk_size_bytes{dir, path}   the size of that filesystem
    arkvory_disk_min_free_bytes          ARKVORY_MIN_FREE_BYTES, the free space uploads must
                                         leave (an upload that would go below it answers 507)

One series per filesystem: directories on one filesystem (by device) are one series, named after
the first of them as given (`dir` data, tmp, uploads, cache; `path` its path), so one disk
filling up is one alert, and a directory mounted apart is a series of its own. A directory that
does not exist (yet) is left out.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .local import LocalState


class FreeSpace(Collector):
    def __init__(self, directories: Sequence[tuple[str, os.PathLike | str]], min_free_bytes: int) -> None:
        """`directories`: (name, path) pairs, the names being the `dir` label's values."""
        self.directories = [(name, os.fspath(path)) for name, path in directories]
        self.min_free_bytes = min_free_bytes

    @classmethod
    def of(cls, storage: LocalState | None, is_writer: bool, min_free_bytes: int) -> FreeSpace:
        """Where a process writes on its own disk: the writer its uploads (ARKVORY_DATA_DIR, its
        tmp/ and uploads/), any process its read cache when on. A gateway without a read cache
        writes nothing there."""
        directories: list[tuple[str, os.PathLike | str]] = []
        if is_writer and storage is not None:
            directories += [("data", storage.root), ("tmp", storage.tmp), ("uploads", storage.uploads)]
        cache = getattr(storage, "cache", None)  # an object store's (shared/storage/read_cache.py)
        if cache is not None:
            directories.append(("cache", cache.directory))
        return cls(directories, min_free_bytes)

    def filesystems(self) -> list[tuple[str, str, int, int]]:
        """(dir, path, free bytes, size in bytes) of each filesystem, in the order given."""
        seen: set[int] = set()
        found = []
        for name, path in self.directories:
            try:
                device = os.stat(path).st_dev
                stats = os.statvfs(path)
            except OSError:
                continue  # not there (yet): nothing is written there either
            if device in seen:
                continue
            seen.add(device)
            found.append((name, path, stats.f_bavail * stats.f_frsize, stats.f_blocks * stats.f_frsize))
        return found

    def collect(self):
        free = GaugeMetricFamily(
            "arkvory_disk_free_bytes",
            "Bytes an unprivileged writer may still use on the filesystem of a directory this process"
            " writes (data: ARKVORY_DATA_DIR, tmp and uploads under it, cache: the read cache), one"
            " series per filesystem",
            labels=["dir", "path"],
        )
        size = GaugeMetricFamily(
            "arkvory_disk_size_bytes", "Size of the filesystem of a directory this process writes",
            labels=["dir", "path"],
        )
        for name, path, free_bytes, size_bytes in self.filesystems():
            free.add_metric([name, path], free_bytes)
            size.add_metric([name, path], size_bytes)
        yield free
        yield size
        yield GaugeMetricFamily(
            "arkvory_disk_min_free_bytes",
            "ARKVORY_MIN_FREE_BYTES: the free space an upload must leave in ARKVORY_DATA_DIR (507 below it)",
            value=self.min_free_bytes,
        )
