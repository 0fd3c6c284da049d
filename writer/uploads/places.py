"""The writer's upload places: bodies received at once (ARKVORY_MAX_UPLOADS), of which one
principal holds at most ARKVORY_MAX_UPLOADS_PER_PRINCIPAL, so one client cannot take them all.

Shared by the one-shot upload, parts and whole-content PUTs. Nobody waits for a place: a
refusal is `503 busy` with Retry-After at once (like a full download queue, SPEC §4, and the
retry table of SPEC §6), and a place is held at most as long as its body keeps arriving
(the receive timeout and the minimum rate of shared/http/bodies.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from arkvory.shared.errors import Busy

RETRY_AFTER_S = 5


class UploadPlaces:
    def __init__(self, capacity: int, per_principal: int) -> None:
        self.capacity = capacity
        self.per_principal = min(per_principal, capacity)
        self.active = 0
        self._by_principal: dict[str, int] = {}

    @contextlib.contextmanager
    def hold(self, principal_id: str) -> Iterator[None]:
        """One place for the block, or Busy at once."""
        held = self._by_principal.get(principal_id, 0)
        if held >= self.per_principal:
            raise Busy(
                f"{held} upload(s) of yours are receiving already, the most one principal may have at"
                f" once (ARKVORY_MAX_UPLOADS_PER_PRINCIPAL={self.per_principal}); retry when one is done",
                retry_after=RETRY_AFTER_S,
            )
        if self.active >= self.capacity:
            raise Busy(
                f"too many uploads at once (ARKVORY_MAX_UPLOADS={self.capacity})", retry_after=RETRY_AFTER_S
            )
        self.active += 1
        self._by_principal[principal_id] = held + 1
        try:
            yield
        finally:
            self.active -= 1
            left = self._by_principal[principal_id] - 1
            if left:
                self._by_principal[principal_id] = left
            else:
                del self._by_principal[principal_id]
