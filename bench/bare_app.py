"""The reference for small requests (issue 6 §6): a bare ASGI app under uvicorn's defaults for
the installed extras (uvloop, httptools) that `pread`s one file and sends it, nothing else —
no routing, no authentication, no admission, no metrics. `bench/small_requests.py` runs it as

    BARE_APP_FILE=<blob> .venv/bin/python -m uvicorn --app-dir bench bare_app:app --port N --no-access-log
"""

from __future__ import annotations

import os

_PATH = os.environ.get("BARE_APP_FILE", "")


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    fd = os.open(_PATH, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        body = os.pread(fd, size, 0)
    finally:
        os.close(fd)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/octet-stream"), (b"content-length", str(size).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
