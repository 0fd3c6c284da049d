"""Login attempts limited per account name and per client address (in memory: one writer).

Fixed windows: at most `limit` per key in `window_s`; the next attempt is `429 rate_limited` with
the seconds until the window ends in `Retry-After`. Per address every attempt counts; per
account name every failed one (so its owner logging in often is never locked out, a guesser
is), whether the account exists or not (a limit only for existing accounts would tell them
apart). Both are checked before any hashing or query. Memory is bounded: past `max_keys`, windows that ended are
dropped, then the oldest half.

Behind a balancer every login comes from the balancer's address, so the per-address limit
becomes one shared limit; the per-account limit still holds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from shared.errors import RateLimited

ACCOUNT_LIMIT = 5  # attempts per account name per window
ADDRESS_LIMIT = 20  # attempts per client address per window
WINDOW_S = 60.0
MAX_KEYS = 50_000


class AttemptLimiter:
    def __init__(
        self, limit: int, window_s: float, clock: Callable[[], float] = time.monotonic, max_keys: int = MAX_KEYS
    ) -> None:
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        self._max_keys = max_keys
        self._windows: dict[str, tuple[float, int]] = {}  # key -> (window start, attempts)

    def blocked(self, key: str) -> float | None:
        """None if one more may happen now, else the seconds until the window ends."""
        now = self._clock()
        start, count = self._windows.get(key, (now, 0))
        if now - start < self.window_s and count >= self.limit:
            return self.window_s - (now - start)
        return None

    def record(self, key: str) -> None:
        now = self._clock()
        start, count = self._windows.get(key, (now, 0))
        if now - start >= self.window_s:
            start, count = now, 0
        if key not in self._windows and len(self._windows) >= self._max_keys:
            self._make_room(now)
        self._windows[key] = (start, count + 1)

    def attempt(self, key: str) -> float | None:
        """Count one attempt unless blocked; None if allowed, else the seconds to wait."""
        wait = self.blocked(key)
        if wait is None:
            self.record(key)
        return wait

    def _make_room(self, now: float) -> None:
        self._windows = {k: v for k, v in self._windows.items() if now - v[0] < self.window_s}
        if len(self._windows) >= self._max_keys:
            keep = list(self._windows.items())[len(self._windows) // 2 :]
            self._windows = dict(keep)


class LoginLimits:
    """Both limits: every attempt counts for its address, failures for the account name."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.by_account = AttemptLimiter(ACCOUNT_LIMIT, WINDOW_S, clock)
        self.by_address = AttemptLimiter(ADDRESS_LIMIT, WINDOW_S, clock)

    def check(self, account_name: str, address: str) -> None:
        """Before an attempt: 429 when either limit is reached; counts it for the address."""
        wait = self.by_address.attempt(address)
        what = "from this address"
        if wait is None:
            wait = self.by_account.blocked(account_name.casefold())
            what = "for this account"
        if wait is not None:
            raise RateLimited(
                f"too many login attempts {what}; try again later", retry_after=max(1, math.ceil(wait))
            )

    def failed(self, account_name: str) -> None:
        self.by_account.record(account_name.casefold())
