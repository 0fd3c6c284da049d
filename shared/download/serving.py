"""What serving content needs of its process: the narrow view the content routes take of it.

The composition root, shared/process/runtime.py's Runtime, is one such process; this package
never imports it (a lower package takes the parts it needs, never the whole process).
"""

from __future__ import annotations

from typing import Protocol

import asyncpg

from arkvory.shared.auth.credentials import CredentialCache
from arkvory.shared.auth.identity import KeyRing
from arkvory.shared.cluster.pins import ReadPins
from arkvory.shared.cluster.transfers import Transfers
from arkvory.shared.metrics import Metrics
from arkvory.shared.settings import Settings
from arkvory.shared.storage import BlobStorage, StorageHealth

from .admission import Admission
from .catalog_cache import CatalogCache
from .throttle import BandwidthScheduler


class ServingProcess(Protocol):
    settings: Settings
    metrics: Metrics
    # Who asks: credentials.resolve reads these three.
    keys: KeyRing
    credentials: CredentialCache
    pool: asyncpg.Pool | None
    # What is served, and where from.
    catalog: CatalogCache
    storage: BlobStorage | None
    storage_health: StorageHealth  # whether the object store answers (its probe's verdict)
    # What a transfer passes through: its read pin, a place, the token buckets, and the
    # registry that lets a lost lease cut it.
    pins: ReadPins
    admission: Admission
    bandwidth: BandwidthScheduler
    transfers: Transfers

    @property
    def status(self) -> str: ...

    @property
    def may_serve(self) -> bool:
        """May this process answer authorized requests now?"""
        ...

    def payload_allowed(self) -> bool:
        """May a payload byte be handed out now? Asked before every chunk: must be cheap."""
        ...
