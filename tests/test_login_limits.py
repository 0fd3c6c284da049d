"""Password guessing limits (issue 13, SPEC §5): per client address as seen through the trusted
balancers, per account under concurrency, and no lockout of a client that signed in before
(device cookies) or of a signed-in account changing its password."""

from __future__ import annotations

import collections
import concurrent.futures

import httpx
import pytest

from arkvory.shared.errors import RateLimited
from arkvory.writer.identity.login_limits import ACCOUNT_LIMIT, ADDRESS_LIMIT, DEVICE_LIMIT, WINDOW_S, LoginLimits

from .fakeclock import FakeTime
from .test_accounts import PASSWORD, make_account

pytestmark = pytest.mark.timeout(120)

WRONG = "not the password"


# Unit tests: the limits with an injected clock.


def refused(call) -> bool:
    try:
        call()
    except RateLimited:
        return True
    return False


def test_attempts_are_counted_before_their_outcome_so_parallel_guesses_cannot_pass_together():
    limits = LoginLimits(FakeTime().clock)
    begun = [limits.begin_login("root", f"10.0.0.{i}", None) for i in range(ACCOUNT_LIMIT)]
    assert refused(lambda: limits.begin_login("root", "10.0.1.1", None))  # none reported yet
    begun[0].passed()  # a right password gives its place back...
    assert not refused(lambda: limits.begin_login("root", "10.0.1.2", None))
    for attempt in begun[1:]:
        attempt.failed()  # ...a wrong one keeps it
    assert refused(lambda: limits.begin_login("ROOT", "10.0.1.3", None))  # names fold case


def test_a_device_and_the_signed_in_credentials_do_not_wait_for_the_accounts_lockout():
    time = FakeTime()
    limits = LoginLimits(time.clock)
    for i in range(ACCOUNT_LIMIT):
        limits.begin_login("root", f"10.0.0.{i}", None).failed()
    assert refused(lambda: limits.begin_login("root", "10.0.1.1", None))
    for _ in range(DEVICE_LIMIT):  # the owner's device: its own limit, and its failures are its own
        limits.begin_login("root", "10.0.2.1", "device-a").failed()
    assert refused(lambda: limits.begin_login("root", "10.0.2.1", "device-a"))
    limits.begin_login("root", "10.0.2.2", "device-b").passed()
    for _ in range(DEVICE_LIMIT):
        limits.begin_reentry("account-id", "root", "10.0.2.1").failed()
    assert refused(lambda: limits.begin_reentry("account-id", "root", "10.0.2.1"))
    time.advance(WINDOW_S)
    limits.begin_login("root", "10.0.1.1", None).passed()
    limits.begin_reentry("account-id", "root", "10.0.2.1").passed()


def test_an_address_counts_every_attempt_whatever_the_name_or_cookie():
    limits = LoginLimits(FakeTime().clock)
    for i in range(ADDRESS_LIMIT):
        limits.begin_login(f"user{i}", "203.0.113.9", "device" if i % 2 else None).passed()
    assert refused(lambda: limits.begin_login("someone", "203.0.113.9", None))
    limits.begin_login("someone", "203.0.113.10", None).passed()


# On a real writer behind a balancer (the test's own address, 127.0.0.1, is the balancer).


@pytest.fixture
def writer(cluster):
    writer = cluster.writer(ARKVORY_TRUSTED_PROXIES="127.0.0.1").wait_ready()
    make_account(writer, "root", admin=True)
    return writer


def attempt_from(writer, address: str, name: str = "root", password: str = WRONG, **headers) -> httpx.Response:
    # Generous: each attempt may wait for the scrypt checks of the others (40 at once, on two
    # cores that other tests keep busy too).
    with writer.client(None, timeout=30) as client:
        return client.post(
            "/api/v1/login", json={"name": name, "password": password},
            headers={"X-Forwarded-For": address, **headers},
        )


def login_from(writer, address: str, name: str = "root", password: str = WRONG, **headers) -> int:
    return attempt_from(writer, address, name, password, **headers).status_code


def use_up_the_address_limit(writer, address: str) -> None:
    """ADDRESS_LIMIT attempts from `address`, few of them hashed: once root is locked out, the
    rest are refused before hashing but still count for the address."""
    statuses = [login_from(writer, address) for _ in range(ADDRESS_LIMIT)]
    assert statuses == [401] * ACCOUNT_LIMIT + [429] * (ADDRESS_LIMIT - ACCOUNT_LIMIT), statuses


def address_limited(answer: httpx.Response) -> bool:
    return answer.status_code == 429 and "from this address" in answer.json()["message"]


def test_forty_parallel_guesses_on_one_account_get_the_limits_count_of_password_checks(writer):
    with concurrent.futures.ThreadPoolExecutor(40) as pool:
        statuses = list(pool.map(lambda i: login_from(writer, f"198.51.100.{i + 1}"), range(40)))
    assert collections.Counter(statuses) == {401: ACCOUNT_LIMIT, 429: 40 - ACCOUNT_LIMIT}, statuses


def test_behind_a_trusted_balancer_each_client_has_its_own_address_limit(writer):
    use_up_the_address_limit(writer, "198.51.100.7")
    assert address_limited(attempt_from(writer, "198.51.100.7", "another"))
    # A hop the client wrote itself, left of what the balancer saw, changes nothing.
    assert address_limited(attempt_from(writer, "192.0.2.1, 198.51.100.7", "another"))
    assert login_from(writer, "198.51.100.8", "another") == 401  # everyone else goes on
    # The log line names the client as the balancer saw it, not the balancer.
    lines = [line for line in writer.stderr.splitlines() if "arkvory.login" in line]
    assert any("attempts from 198.51.100.7" in line for line in lines), lines
    assert not any("127.0.0.1" in line for line in lines), lines


def test_without_trusted_proxies_x_forwarded_for_is_not_believed(cluster):
    writer = cluster.writer().wait_ready()
    use_up_the_address_limit(writer, "198.51.100.1")
    assert address_limited(attempt_from(writer, "198.51.100.2", "another"))  # both were 127.0.0.1


@pytest.mark.soak  # 10 s or more of real time (~30 scrypt checks; tests/test_cli_credentials.py keeps the device rule in the default tier): .ci/run runs it (pytest -m soak)
def test_a_guesser_cannot_lock_out_a_client_that_signed_in_before(writer):
    with httpx.Client(base_url=writer.url, timeout=30, headers={"X-Forwarded-For": "198.51.100.1"}) as owner:
        first = owner.post("/api/v1/login", json={"name": "root", "password": PASSWORD})
        assert first.status_code == 200, first.text
        device = owner.cookies.get("arkvory_device")
        assert device and "HttpOnly" in first.headers["set-cookie"] and PASSWORD not in device
        session = first.json()["token"]
        for i in range(ACCOUNT_LIMIT):  # a guesser from elsewhere locks root out...
            assert login_from(writer, f"203.0.113.{i + 1}") == 401
        assert login_from(writer, "203.0.113.99", password=PASSWORD) == 429
        # ...but not the owner's device, nor its forged or borrowed copies.
        assert owner.post("/api/v1/login", json={"name": "root", "password": PASSWORD}).status_code == 200
        forged = device[:-4] + ("AAAA" if not device.endswith("AAAA") else "BBBB")
        assert login_from(writer, "203.0.113.98", password=PASSWORD, Cookie=f"arkvory_device={forged}") == 429
        make_account(writer, "alice")
        for i in range(ACCOUNT_LIMIT):
            assert login_from(writer, f"203.0.113.{i + 1}", "alice") == 401
        assert login_from(writer, "203.0.113.97", "alice", PASSWORD, Cookie=f"arkvory_device={device}") == 429
        # The signed-in owner changes the password and makes a long-lived token meanwhile.
        with writer.client(session) as client:
            changed = client.post("/api/v1/account/password", json={"oldPassword": PASSWORD, "newPassword": "a new password"})
            assert changed.status_code == 204, changed.text
            token = client.post("/api/v1/tokens", json={"password": "a new password", "expiresInSeconds": 86400 * 30})
            assert token.status_code == 201, token.text
        # The device has a limit of its own.
        for _ in range(DEVICE_LIMIT):
            assert owner.post("/api/v1/login", json={"name": "root", "password": WRONG}).status_code == 401
        assert owner.post("/api/v1/login", json={"name": "root", "password": "a new password"}).status_code == 429
