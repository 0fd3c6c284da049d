"""Password hashing for accounts: scrypt from hashlib, off the event loop and bounded.

The cost follows OWASP's guidance for scrypt (N=2^17, r=8, p=1). Each hash keeps its salt and
cost parameters beside it, so old hashes (N=2^14 before issue 13) still verify and a login that
succeeds with one stores a new hash at today's cost (`needs_rehash`).

One hash needs 128 MiB (128 × r × N bytes) and about 0.3 s of one core. hashlib releases the GIL
while it runs, so each runs in a worker thread and the event loop keeps serving downloads; at
most `MAX_CONCURRENT` run at once (memory: 128 MiB each; CPU: at most half of the cores, so
serving always keeps some), with at most `MAX_WAITING` callers in line (about 2 s of waiting);
beyond that a login is `503 busy` at once instead of a queue that grows with an attack.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as concurrent_futures
import dataclasses
import hashlib
import hmac
import os

from arkvory.shared.errors import Busy, InvalidInput

SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**17, 8, 1
DKLEN = 32
MIN_PASSWORD, MAX_PASSWORD = 8, 1024
MAX_CONCURRENT = max(1, min(2, (os.cpu_count() or 1) // 2))
MAX_WAITING = 8


@dataclasses.dataclass(frozen=True)
class PasswordHash:
    digest: bytes
    salt: bytes
    n: int = SCRYPT_N
    r: int = SCRYPT_R
    p: int = SCRYPT_P


def check_password_text(password: object, what: str = "'password'") -> str:
    """A new password: bounded before anything hashes it."""
    if not isinstance(password, str) or not MIN_PASSWORD <= len(password) <= MAX_PASSWORD:
        raise InvalidInput(f"{what} must be a string of {MIN_PASSWORD}-{MAX_PASSWORD} characters")
    return password


def scrypt_memory(n: int, r: int, p: int) -> int:
    """The bytes OpenSSL's scrypt allocates (its `maxmem` check): V is 128·r·(N+2), B is 128·r·p."""
    return 128 * r * (n + 2 + p)


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, maxmem=scrypt_memory(n, r, p), dklen=DKLEN
    )


def hash_password(password: str) -> PasswordHash:
    salt = os.urandom(16)
    return PasswordHash(_scrypt(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P), salt)


def verify_password(password: str, stored: PasswordHash) -> bool:
    candidate = _scrypt(password, stored.salt, stored.n, stored.r, stored.p)
    return hmac.compare_digest(candidate, stored.digest)


def needs_rehash(stored: PasswordHash) -> bool:
    """A hash made at another cost than today's: replaced after the next successful login."""
    return (stored.n, stored.r, stored.p) != (SCRYPT_N, SCRYPT_R, SCRYPT_P)


# Verified when the account does not exist, so that a failed login takes as long either way.
DUMMY = PasswordHash(digest=b"\0" * DKLEN, salt=b"arkvory-no-such-account")


class PasswordHasher:
    """Runs scrypt on its own `concurrent` threads; at most `waiting` more calls queue for them.

    The count covers a hash until its thread is done, even when the request that asked for it
    was cancelled meanwhile: a cancelled login must not free a place its scrypt still uses."""

    def __init__(self, concurrent: int = MAX_CONCURRENT, waiting: int = MAX_WAITING) -> None:
        self._executor = concurrent_futures.ThreadPoolExecutor(concurrent, thread_name_prefix="scrypt")
        self._capacity = concurrent + waiting
        self._in_flight = 0

    async def _run(self, function, *args):
        if self._in_flight >= self._capacity:
            raise Busy("too many logins at once; try again")
        loop = asyncio.get_running_loop()
        self._in_flight += 1
        future = self._executor.submit(function, *args)
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(self._done))
        return await asyncio.wrap_future(future)

    def _done(self) -> None:
        self._in_flight -= 1

    async def hash(self, password: str) -> PasswordHash:
        return await self._run(hash_password, password)

    async def verify(self, password: str, stored: PasswordHash) -> bool:
        return await self._run(verify_password, password, stored)
