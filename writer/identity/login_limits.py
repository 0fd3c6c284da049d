"""Password guessing limits (SPEC §5), in memory: there is one writer, and it alone checks
passwords. A restart forgets them, which gives a guesser one more window, no more.

Fixed windows of `WINDOW_S`: a key at its limit answers `429 rate_limited` with the seconds
until its window ends in `Retry-After`. Three kinds of key:

- the client's address (shared/http/client_address.py: the peer, or behind the operator's balancers
  the address they saw): every login and sign-up counts, `ADDRESS_LIMIT` a window;
- the account name, for clients without its device cookie: every failed password counts,
  `ACCOUNT_LIMIT` a window, whether the account exists or not (a limit only for existing
  accounts would tell them apart). Keyed on the folded name (account_names.py), the form in
  which names are unique and looked up: every spelling of a name that signs in to an account
  counts under that account's one key;
- a device, for clients that signed in as that account before (writer/identity/device_cookies.py):
  `DEVICE_LIMIT` failures a window each, and they do not count for the account nor wait for it.
  So a guesser who locks an account out locks out only the clients that never signed in to
  it (OWASP's device cookies), and its owner keeps signing in;
- the account's signed-in credentials together, re-entering its password (a password change, a
  token that may outlive its session): `DEVICE_LIMIT` failures a window. Only a holder of one
  of its credentials can use this up, and stealing one, or making many tokens from it, does not
  multiply the guesses.

The account and device limits hold under concurrency: an attempt is counted *before* its
password is hashed, in the same step as the check (no await between), and given back when the
password was right or never checked. Forty parallel guesses get `ACCOUNT_LIMIT` hashes, the
rest 429. A check whose request was cancelled stays counted.

Memory is bounded: past `MAX_KEYS` per kind, windows that ended are dropped, then the oldest half.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from arkvory.shared.errors import RateLimited

from .account_names import fold

log = logging.getLogger("arkvory.login")

ACCOUNT_LIMIT = 5  # failed passwords per account name per window, from clients without its device cookie
DEVICE_LIMIT = 5  # failed passwords per device cookie (or per account's signed-in credentials) per window
ADDRESS_LIMIT = 20  # attempts per client address per window
WINDOW_S = 60.0
MAX_KEYS = 50_000


class AttemptLimiter:
    """At most `limit` attempts per key in each fixed window of `window_s`."""

    def __init__(
        self, limit: int, window_s: float, clock: Callable[[], float] = time.monotonic, max_keys: int = MAX_KEYS
    ) -> None:
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        self._max_keys = max_keys
        self._windows: dict[str, tuple[float, int]] = {}  # key -> (window start, attempts)

    def take(self, key: str) -> float | None:
        """Count one attempt unless the key is at its limit: None when counted, else the
        seconds until its window ends. Checking and counting are one step."""
        now = self._clock()
        start, count = self._current(key, now)
        if count >= self.limit:
            return self.window_s - (now - start)
        if key not in self._windows and len(self._windows) >= self._max_keys:
            self._make_room(now)
        self._windows[key] = (start, count + 1)
        return None

    def give_back(self, key: str, taken_at: float) -> None:
        """Uncount an attempt taken at `taken_at`, unless its window has ended since."""
        start, count = self._current(key, self._clock())
        if count > 0 and start <= taken_at:
            self._windows[key] = (start, count - 1)

    def at_limit(self, key: str) -> bool:
        return self._current(key, self._clock())[1] >= self.limit

    def now(self) -> float:
        return self._clock()

    def _current(self, key: str, now: float) -> tuple[float, int]:
        start, count = self._windows.get(key, (now, 0))
        if now - start >= self.window_s:
            return now, 0
        return start, count

    def _make_room(self, now: float) -> None:
        self._windows = {k: v for k, v in self._windows.items() if now - v[0] < self.window_s}
        if len(self._windows) >= self._max_keys:
            keep = list(self._windows.items())[len(self._windows) // 2 :]
            self._windows = dict(keep)


class PasswordAttempt:
    """One password check, already counted against its account or device key. Exactly what
    happened is reported once: `passed()` (right, or not checked at all) gives the count back,
    `failed()` keeps it."""

    def __init__(self, limiter: AttemptLimiter, key: str, what: str, address: str) -> None:
        self._limiter = limiter
        self._key = key
        self._what = what
        self._address = address
        self._taken_at = limiter.now()
        self._took_the_last_place = limiter.at_limit(key)

    def passed(self) -> None:
        self._limiter.give_back(self._key, self._taken_at)

    def failed(self, name_exists: bool = True) -> None:
        if self._took_the_last_place:  # one line per window, not one per refused guess
            # The name only when it is an account's: a password typed into the name field of a
            # login form must not end up in a log.
            who = self._what if name_exists else "an unknown account name"
            log.warning(
                "login: %d failed passwords for %s within %d s, last from %s; it waits until the window ends",
                self._limiter.limit, who, self._limiter.window_s, self._address,
            )


class LoginLimits:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.by_address = AttemptLimiter(ADDRESS_LIMIT, WINDOW_S, clock)
        self.by_account = AttemptLimiter(ACCOUNT_LIMIT, WINDOW_S, clock)
        self.by_device = AttemptLimiter(DEVICE_LIMIT, WINDOW_S, clock)

    def count_address(self, address: str) -> None:
        """Every login and sign-up from `address`; 429 past its limit."""
        wait = self.by_address.take(address)
        if wait is not None:
            _refuse("from this address", wait)
        if self.by_address.at_limit(address):  # this one took the last place: say so once
            log.warning(
                "login: %d attempts from %s within %d s; it waits until the window ends",
                self.by_address.limit, address, self.by_address.window_s,
            )

    def begin_login(self, account_name: str, address: str, device: str | None) -> PasswordAttempt:
        """Before hashing a login's password: counts it for the address, then for the device
        when the client holds a valid device cookie for this account, else for the account."""
        self.count_address(address)
        if device is not None:
            return self._begin(
                self.by_device, f"device:{device}", "from this device", f"a device of account {account_name!r}", address
            )
        return self._begin(
            self.by_account, fold(account_name), "for this account", f"account {account_name!r}", address
        )

    def begin_reentry(self, account_id: str, account_name: str, address: str) -> PasswordAttempt:
        """Before hashing a password that a signed-in credential of the account re-enters: a
        limit of their own, never the one that guessers from outside use up."""
        return self._begin(
            self.by_device, f"signed-in:{account_id}", "with this account's credentials",
            f"the signed-in credentials of account {account_name!r}", address,
        )

    def _begin(self, limiter: AttemptLimiter, key: str, refusal: str, what: str, address: str) -> PasswordAttempt:
        wait = limiter.take(key)
        if wait is not None:
            _refuse(refusal, wait)
        return PasswordAttempt(limiter, key, what, address)


def _refuse(what: str, wait: float) -> None:
    raise RateLimited(f"too many login attempts {what}; try again later", retry_after=max(1, math.ceil(wait)))
