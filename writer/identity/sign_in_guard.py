"""What a login or sign-up request must be (SPEC §5): JSON, and not sent by another site's page.

Without this, any page could sign its visitor's browser in as the page's author (login CSRF): a
form posted across sites carries no cookie of ours, needs none, and its answer sets
`arkvory_session`. So, checked before the body is read:

- `Content-Type: application/json` only (`415 unsupported_media_type` otherwise). An HTML form
  can send only urlencoded, multipart or text/plain bodies, and a script on another site can send
  JSON only after a CORS preflight, which the writer never grants.
- `Sec-Fetch-Site` (what the browser itself says of the request) is absent, `same-origin` or
  `none`: `cross-site` and `same-site` (a sibling subdomain, another port) are `403 forbidden`.
- An `Origin` header names this server: same host name as the request's `Host` (or, from one of
  `ARKVORY_TRUSTED_PROXIES`, its `X-Forwarded-Host`), and the same port when that names one.
  Schemes are not compared and a `Host` without a port matches any: a balancer that ends TLS
  sends plain HTTP, and nginx's `$host` drops the port, so the writer cannot know either; a
  browser that tells `Sec-Fetch-Site` still refuses both. `Origin: null` (a sandboxed frame, a
  local file, some redirects) is never this server.

Programs send neither header (the CLI, curl, the console's in-process call to the API: its own
form carries a CSRF token, writer/console/security.py), and are unaffected.
"""

from __future__ import annotations

import urllib.parse

from starlette.requests import Request

from arkvory.shared.errors import Forbidden, UnsupportedMediaType
from arkvory.shared.http.client_address import Network, from_trusted_proxy
from arkvory.shared.http.media_types import essence

_SAME_ORIGIN_SITES = frozenset({"same-origin", "none"})  # none: typed by the user, no page sent it
_DEFAULT_PORTS = {"http": 80, "https": 443}
_SHOWN = 100  # of a refused Origin, in the answer: bounded


def check_sign_in_request(request: Request, trusted_proxies: tuple[Network, ...]) -> None:
    """403 for a request from another site, 415 for a body that is not declared JSON (module
    docstring). Only headers are read."""
    site = request.headers.getlist("sec-fetch-site")
    if site and (len(site) > 1 or site[0].strip().lower() not in _SAME_ORIGIN_SITES):
        raise Forbidden(
            "sign-in and sign-up are refused from another site's page (Sec-Fetch-Site: "
            f"{', '.join(site)[:_SHOWN]}); use this server's own console"
        )
    origins = request.headers.getlist("origin")
    if origins and (len(origins) > 1 or not _is_own_origin(origins[0], _own_host(request, trusted_proxies))):
        raise Forbidden(
            f"sign-in and sign-up are refused from another site's page (Origin {', '.join(origins)[:_SHOWN]!r}"
            " is not this server); use this server's own console"
        )
    content_type = request.headers.get("content-type")
    if content_type is None or essence(content_type) != "application/json":
        raise UnsupportedMediaType("sign-in and sign-up take a JSON body sent with 'Content-Type: application/json'")


def _own_host(request: Request, trusted_proxies: tuple[Network, ...]) -> tuple[str, int | None] | None:
    """(host name, port or None) the client asked for; None when that cannot be told."""
    value = request.headers.get("host")
    if from_trusted_proxy(request.scope, trusted_proxies):
        forwarded = request.headers.getlist("x-forwarded-host")
        if forwarded:
            # The right-most entry: the one the balancer nearest to us wrote.
            value = forwarded[-1].split(",")[-1]
    return _host_and_port(value.strip()) if value else None


def _host_and_port(authority: str) -> tuple[str, int | None] | None:
    try:
        parts = urllib.parse.urlsplit("//" + authority)
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname or parts.path or parts.username is not None:
        return None
    return parts.hostname, port


def _is_own_origin(origin: str, own: tuple[str, int | None] | None) -> bool:
    if own is None:
        return False
    try:
        parts = urllib.parse.urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return False
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname or parts.path or parts.username is not None:
        return False  # "null", or not an origin at all
    host, own_port = own
    if parts.hostname != host:
        return False
    return own_port is None or (port or _DEFAULT_PORTS[parts.scheme]) == own_port
