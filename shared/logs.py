"""Logging set-up from ARKVORY_LOG_FORMAT / ARKVORY_LOG_LEVEL; one line per record. And the
access log's logger (`arkvory.access`, ARKVORY_ACCESS_LOG=off|text|json): its own handler,
whatever the level of the others, not passed on to the root logger's handler. Its records come
from the access log's thread (arkvory.shared.http.access_log), each a batch of whole lines
already in the shape of these formats (TEXT_FORMAT, JsonFormatter's keys), written as they are.

A line that names a client names it through `arkvory.shared.http.client_address.client_address`,
never the socket peer (`scope["client"]`): behind the operator's balancers the peer is the
balancer.
"""

from __future__ import annotations

import json
import logging
import sys

ACCESS_LOGGER = "arkvory.access"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + ".%03d" % record.msecs,
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class QuietPoolRetries(logging.Filter):
    """asyncpg's pool logs a warning with a traceback each time it fails to restore its floor
    of connections (every 1, 2, 4... s while the database is down). The process's loops already
    say that the database is down, once (shared/cluster/supervision.py, DATABASE): those records
    go to debug."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or "connection floor" not in record.getMessage():
            return True
        if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


def configure(log_format: str, level: str, access_log: str = "off") -> None:
    root = logging.getLogger()
    root.handlers[:] = [_stderr_handler(log_format)]
    root.setLevel(level.upper())
    # While the database is down its retries would log a traceback each (issue 13 item 17).
    logging.getLogger("asyncpg.pool").addFilter(QuietPoolRetries())
    # Its own switch and format: ARKVORY_LOG_LEVEL=warning keeps it; and never twice through
    # the root's handler. Operators may add handlers to `arkvory.access` to send it elsewhere.
    access = logging.getLogger(ACCESS_LOGGER)
    access.propagate = False
    access.setLevel(logging.INFO)
    access.handlers[:] = []
    if access_log != "off":
        lines = logging.StreamHandler(sys.stderr)
        lines.setFormatter(logging.Formatter("%(message)s"))  # (written by the access log itself)
        access.handlers.append(lines)


def _stderr_handler(log_format: str) -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    return handler
