"""The believed client address (shared/http/client_address.py): X-Forwarded-For only from trusted
balancers, read from the right; everything else is the peer."""

from __future__ import annotations

import ipaddress

import pytest

from arkvory.shared.http.client_address import MAX_HOPS, believed_address, client_address

BALANCERS = (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/8"))


@pytest.mark.parametrize(
    ("peer", "forwarded", "trusted", "expected"),
    [
        # No trusted balancers: the header is the client's own words, ignored.
        ("203.0.113.9", ["198.51.100.1"], (), "203.0.113.9"),
        # A peer that is not a balancer cannot speak for anyone else.
        ("203.0.113.9", ["198.51.100.1"], BALANCERS, "203.0.113.9"),
        # One balancer: the hop it appended.
        ("10.0.0.2", ["198.51.100.1"], BALANCERS, "198.51.100.1"),
        # A client that forges hops to the left is still the right-most untrusted one.
        ("10.0.0.2", ["1.1.1.1, 10.9.9.9, 198.51.100.1"], BALANCERS, "198.51.100.1"),
        # A chain of balancers (nginx in front of HAProxy, each appending).
        ("10.0.0.2", ["198.51.100.1, 10.0.0.7, 10.0.0.8"], BALANCERS, "198.51.100.1"),
        # HAProxy adds its own header after the client's: one list, in order.
        ("10.0.0.2", ["6.6.6.6", "198.51.100.1"], BALANCERS, "198.51.100.1"),
        # A balancer with no header, or only balancers in it: the left-most balancer known.
        ("10.0.0.2", [], BALANCERS, "10.0.0.2"),
        ("10.0.0.2", ["10.0.0.5"], BALANCERS, "10.0.0.5"),
        # Garbage is never believed (nor echoed into a log): the last believed hop stays.
        ("10.0.0.2", ["evil\r\nX: y"], BALANCERS, "10.0.0.2"),
        ("10.0.0.2", ["198.51.100.1, unknown, 10.0.0.3"], BALANCERS, "10.0.0.3"),
        # IPv6, and IPv4 clients seen through a dual-stack socket.
        ("fd00::1", ["2001:db8::5"], BALANCERS, "2001:db8::5"),
        ("::ffff:10.0.0.2", ["::ffff:198.51.100.1"], BALANCERS, "198.51.100.1"),
        (None, ["198.51.100.1"], BALANCERS, "unknown"),
    ],
)
def test_believed_address(peer, forwarded, trusted, expected):
    assert believed_address(peer, forwarded, trusted) == expected


def test_at_most_max_hops_are_read():
    chain = ", ".join(["198.51.100.1"] + ["10.0.0.9"] * (MAX_HOPS + 5))
    assert believed_address("10.0.0.2", [chain], BALANCERS) == "10.0.0.9"


def test_resolved_once_per_request_from_the_scope():
    scope = {"client": ("10.0.0.2", 5000), "headers": [(b"x-forwarded-for", b"198.51.100.1")]}
    assert client_address(scope, BALANCERS) == "198.51.100.1"
    scope["headers"] = []
    assert client_address(scope, BALANCERS) == "198.51.100.1"  # kept for the log lines that follow
    assert client_address({"client": None, "headers": []}, BALANCERS) == "unknown"


def test_forwarding_from_a_peer_not_trusted_is_said_once(monkeypatch, caplog):
    """Behind a balancer missing from ARKVORY_TRUSTED_PROXIES every client is the balancer (one
    login limit for all): the first such request says so, naming the variable; later ones, and
    a trusted balancer's, say nothing."""
    from arkvory.shared.http import client_address as module

    monkeypatch.setattr(module, "_untrusted_forwarding_seen", False)
    forwarded = [(b"x-forwarded-for", b"198.51.100.1")]
    with caplog.at_level("WARNING", logger="arkvory.http"):
        client_address({"client": ("10.0.0.2", 1), "headers": forwarded}, BALANCERS)  # trusted
        client_address({"client": ("127.0.0.1", 1), "headers": []}, ())  # no header
        assert not caplog.records
        for _ in range(3):
            assert client_address({"client": ("127.0.0.1", 1), "headers": forwarded}, ()) == "127.0.0.1"
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert "127.0.0.1" in message and "ARKVORY_TRUSTED_PROXIES (not set)" in message
    assert "198.51.100.1" not in message  # the header's words are never echoed into a log
