"""What a browser finds at a read gateway's `/console/` (and `/`): a small page that says the
console is on the writer (issue 25 §7), instead of a JSON 404 a person cannot read.

It is still a 404, since nothing is served here, and it names no address: the gateway cannot
know where the writer or the balancer is reached from the browser (its own view of the writer
may be an internal one), so it redirects nowhere. Programs, which do not ask for HTML by name,
get the API's JSON 404 as before. A fixed page: no input of the request is ever in it.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from arkvory.shared.http.media_types import accepts_html

CONSOLE_PREFIX = "/console"

PAGE = b"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>The console is on the writer - Arkvory</title>
</head>
<body>
<main>
<h1>The console is on the writer</h1>
<p>This address is an Arkvory <strong>read gateway</strong>: it serves downloads only (GET and HEAD
of the content routes).</p>
<p>The web console is served by the <strong>writer</strong> at <code>/console/</code>: open it at the
writer's address, or at your balancer's address, which sends <code>/console/</code> to the writer.</p>
<p>Programs: the writer describes its API at <code>/api/v1/openapi.json</code>.</p>
</main>
</body>
</html>
"""

_HEADERS = [
    (b"content-type", b"text/html; charset=utf-8"),
    (b"content-length", str(len(PAGE)).encode()),
    (b"content-security-policy", b"default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
    (b"vary", b"Accept"),
]


def _is_console_path(path: str) -> bool:
    return path == "/" or path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/")


class ConsoleHint:
    """A browser's GET or HEAD of `/` or the console's paths: the page above (404)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] in ("GET", "HEAD")
            and _is_console_path(scope["path"])
            and accepts_html(scope["headers"])
        ):
            await send({"type": "http.response.start", "status": 404, "headers": list(_HEADERS)})
            await send({"type": "http.response.body", "body": PAGE if scope["method"] == "GET" else b""})
            return
        await self.app(scope, receive, send)
