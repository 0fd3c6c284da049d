"""What a process remembers of bearer tokens (shared/auth): by a BLAKE2b digest, never the
token, only for tokens that were valid, and for database credentials only while the cache is
trusted and the credential has not expired. Revocation and expiry on real processes:
tests/test_credentials.py."""

from __future__ import annotations

import uuid

import pytest

from arkvory.shared.auth.credentials import CredentialCache, mint, resolve_now
from arkvory.shared.auth.identity import ANONYMOUS, KeyRing, Principal, memo_key, token_digest
from arkvory.shared.errors import Unauthorized

pytestmark = pytest.mark.timeout(10)

TOKEN = "arkvory_key_memo_test_token_000000000000000001"


def _ring() -> KeyRing:
    return KeyRing.from_entries([{"id": "ci", "sha256": token_digest(TOKEN), "scopes": ["read:*"]}])


def _listening_cache(now: list[float]) -> CredentialCache:
    cache = CredentialCache(clock=lambda: now[0])
    cache.started_listening()
    return cache


def test_a_file_key_is_remembered_by_its_blake2b_digest_not_by_the_token():
    ring, cache = _ring(), _listening_cache([0.0])
    assert ring.remembered(memo_key(TOKEN)) is None
    principal = resolve_now(ring, cache, f"Bearer {TOKEN}")
    assert principal is not None and principal.id == "key:ci"
    # The next request is answered from the memo, which holds the digest only.
    assert ring.remembered(memo_key(TOKEN)) is principal
    assert list(ring._remembered) == [memo_key(TOKEN)]
    assert len(memo_key(TOKEN)) == 64 and TOKEN.encode() not in memo_key(TOKEN)


def test_a_token_close_to_a_remembered_one_is_refused():
    ring, cache = _ring(), _listening_cache([0.0])
    assert resolve_now(ring, cache, f"Bearer {TOKEN}") is not None
    for other in (TOKEN[:-1] + "2", TOKEN + "0", TOKEN[:-1]):
        with pytest.raises(Unauthorized):
            resolve_now(ring, cache, f"Bearer {other}")
    assert len(ring._remembered) == 1  # refused tokens are not remembered
    assert resolve_now(ring, cache, None) is ANONYMOUS


def test_a_database_credential_is_answered_from_memory_only_while_trusted_and_unexpired():
    now = [100.0]
    ring, cache = _ring(), _listening_cache(now)
    token = mint("pat").token
    header = f"Bearer {token}"
    assert resolve_now(ring, cache, header) is None  # unknown here: the database decides
    principal = Principal(id="account:x", kind="account", scopes=frozenset({"read:r"}), credential_id=uuid.uuid4())
    cache.put(memo_key(token), principal, expires_at=110.0, generation=cache.generation)
    assert resolve_now(ring, cache, header) is principal
    assert resolve_now(ring, cache, f"Bearer {mint('pat').token}") is None  # another token: not this entry
    now[0] = 110.0  # its expiry, read from the database, ends it without a notification
    assert resolve_now(ring, cache, header) is None
    cache.put(memo_key(token), principal, expires_at=200.0, generation=cache.generation)
    assert resolve_now(ring, cache, header) is principal
    cache.notified("revoked")  # a revocation anywhere flushes it
    assert resolve_now(ring, cache, header) is None
    cache.put(memo_key(token), principal, expires_at=200.0, generation=cache.generation)
    cache.stop_listening()  # nothing is answered from memory while nobody listens
    assert resolve_now(ring, cache, header) is None
