"""HTTP Basic credentials that a browser adds on its own, refused when another site's page
made the request (issue 25 §9: Basic carries a token as its password, shared/auth/authorization.py).

A browser that was once given a token in its Basic dialog (an API 401 challenges for Basic,
shared/errors.py) keeps it for this server and adds it by itself to later requests here,
including those that another site's page makes: SameSite, which keeps the console's cookie at
home, does not apply to it. Such a page could then change things with the user's token (CSRF) or
pull private content into itself. So a request with Basic credentials is refused (403) when the
browser says another site made it (`Sec-Fetch-Site: cross-site` or `same-site`), unless it is a
top-level navigation that only reads (GET or HEAD with `Sec-Fetch-Mode: navigate` and, when the
browser says where the answer goes, `Sec-Fetch-Dest: document`: a link to a download, whose answer
only the user sees): the rule SameSite=Lax gives cookies. A frame another page holds
(`Sec-Fetch-Dest: iframe`, `frame`, `embed`, `object`) navigates too, but the user never asked for
it: a hidden one would spend their token's budget, so it is refused like any other fetch. A change with
Basic credentials and an `Origin` but no `Sec-Fetch-Site` (a browser too old to say) is refused
too. Programs (curl, wget, aria2, package managers) send none of these headers, and no browser
adds a Bearer token on its own: both pass untouched.
"""

from __future__ import annotations

from starlette.types import Scope

from arkvory.shared.errors import Forbidden

_SAME_SITE = frozenset({b"same-origin", b"none"})  # none: typed by the user, no page sent it
_READS = frozenset({"GET", "HEAD"})
_REFUSED = (
    "Basic credentials are refused in a request that another site's page made (the browser "
    "adds them by itself); open the link directly, or send 'Authorization: Bearer <token>'"
)


def is_basic(authorization: bytes) -> bool:
    return authorization[:6].lower() == b"basic "


def refusal(scope: Scope) -> Forbidden | None:
    """Forbidden for a request with Basic credentials that another site's page made in a
    browser (module docstring), else None. The caller has seen that the request sends Basic."""
    sites: list[bytes] = []
    mode = dest = origin = None
    for name, value in scope["headers"]:
        if name == b"sec-fetch-site":
            sites.append(value.strip().lower())
        elif name == b"sec-fetch-mode":
            mode = value.strip().lower()
        elif name == b"sec-fetch-dest":
            dest = value.strip().lower()
        elif name == b"origin":
            origin = value
    reads = scope["method"] in _READS
    if sites:
        if len(sites) == 1 and sites[0] in _SAME_SITE:
            return None
        if len(sites) == 1 and reads and mode == b"navigate" and dest in (None, b"document"):
            return None
        return Forbidden(_REFUSED)
    if origin is not None and not reads:
        return Forbidden(_REFUSED)
    return None
