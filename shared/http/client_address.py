"""The client's address as Arkvory believes it (SPEC §5): login limits, log lines and the access
log use it.

Without `ARKVORY_TRUSTED_PROXIES` it is the TCP peer and `X-Forwarded-For` is ignored: anyone can
write that header. When the peer is one of the operator's balancers, its `X-Forwarded-For` is
read from the right, the end each balancer appends to, skipping the balancers' own addresses; the
first hop that is not one of them is the client. Hops further left were written by the client
itself and are never believed. Several `X-Forwarded-For` headers count as one list in order
(HAProxy adds its own header after the client's, nginx appends to the client's).

The server (server.py) rewrites nothing: rewriting the peer for every request, downloads included,
costs where nothing needs it, and a server-wide switch trusts a whole header list or nothing;
this resolves on demand, once per request.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable

from starlette.types import Scope

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

UNKNOWN = "unknown"
# A bound on the work per request: a chain of balancers is a few hops, never dozens.
MAX_HOPS = 16
_SCOPE_KEY = "arkvory.client_address"

log = logging.getLogger("arkvory.http")
# An operator who forgot ARKVORY_TRUSTED_PROXIES behind a balancer sees every client as the
# balancer (one login limit for everyone): said once per process, at the first such request.
_untrusted_forwarding_seen = False


def client_address(scope: Scope, trusted: tuple[Network, ...]) -> str:
    """The believed client address of this request (computed once, kept in the scope)."""
    known = scope.get(_SCOPE_KEY)
    if known is None:
        peer = scope.get("client")
        forwarded = [value.decode("latin-1") for key, value in scope["headers"] if key == b"x-forwarded-for"]
        known = scope[_SCOPE_KEY] = address_of(peer[0] if peer else None, forwarded, trusted)
    return known


def address_of(peer: str | None, forwarded_for: list[str], trusted: tuple[Network, ...]) -> str:
    """`believed_address`, and the warning (once per process) when `X-Forwarded-For` came from
    a peer that is not trusted. (The access log calls it too, as it makes each line.)"""
    if forwarded_for and not _untrusted_forwarding_seen and peer is not None:
        address = _parse(peer)
        if address is not None and not _is_trusted(address, trusted):
            _warn_untrusted_forwarding(str(address), bool(trusted))
    return believed_address(peer, forwarded_for, trusted)


def _warn_untrusted_forwarding(peer: str, any_trusted: bool) -> None:
    global _untrusted_forwarding_seen
    _untrusted_forwarding_seen = True
    log.warning(
        "a request from %s carried X-Forwarded-For, which is ignored: %s is not in "
        "ARKVORY_TRUSTED_PROXIES%s; if it is your balancer, add its address there, or every "
        "client behind it counts as one for the login limits (said once)",
        peer, peer, "" if any_trusted else " (not set)",
    )


def believed_address(peer: str | None, forwarded_for: Iterable[str], trusted: tuple[Network, ...]) -> str:
    """The right-most hop that is not a trusted balancer; the peer itself unless it is one."""
    believed = _parse(peer) if peer is not None else None
    if believed is None:
        return UNKNOWN
    if not _is_trusted(believed, trusted):
        return str(believed)
    hops = [hop for value in forwarded_for for hop in value.split(",")]
    for hop in reversed(hops[-MAX_HOPS:]):
        address = _parse(hop)
        if address is None:
            # A trusted balancer writes addresses; anything else came from further left, where
            # nothing is believed: the last balancer is the best we know.
            break
        believed = address
        if not _is_trusted(address, trusted):
            break
    return str(believed)


def _parse(text: str) -> Address | None:
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    # A dual-stack socket shows IPv4 clients as ::ffff:a.b.c.d; they are IPv4 to the operator.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _is_trusted(address: Address, trusted: tuple[Network, ...]) -> bool:
    return any(address in network for network in trusted)


def from_trusted_proxy(scope: Scope, trusted: tuple[Network, ...]) -> bool:
    """Whether the TCP peer is one of the operator's balancers, whose other headers (the host the
    client asked for) may then be believed too."""
    peer = scope.get("client")
    address = _parse(peer[0]) if peer else None
    return address is not None and _is_trusted(address, trusted)
