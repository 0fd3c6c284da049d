"""Logging set-up from ARKVORY_LOG_FORMAT / ARKVORY_LOG_LEVEL; one line per record.

A line that names a client names it through `arkvory.shared.http.client_address.client_address`,
never the socket peer (`scope["client"]`): behind the operator's balancers the peer is the
balancer. There is no per-request access line (a download is counted in the metrics instead);
the login limits' lines are the ones that name clients.
"""

from __future__ import annotations

import json
import logging
import sys


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
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


def configure(log_format: str, level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # While the database is down its retries would log a traceback each (issue 13 item 17).
    logging.getLogger("asyncpg.pool").addFilter(QuietPoolRetries())
