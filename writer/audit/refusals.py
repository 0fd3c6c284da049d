"""Refused changes worth an audit entry, and the bound on how many an attacker can make us write.

What is recorded (outcome `refused`, with the refusal's status):
- a failed sign-in (401 at POST /api/v1/login), naming the account only when it exists (a name
  typed where the password belongs never lands in the table);
- a change refused for want of permission (403), by whoever asked;
- a change refused with 401 to a principal that was known (a wrong password given again to
  make a lasting token, change the password or adopt a key).
Everything else refused (400, 404, 409, 422, 429, and 401 for a missing or unknown credential)
is the client's mistake or already limited elsewhere (the login limits): not recorded.

Anyone can make refusals, so they are recorded within token buckets: each source (the principal,
or the client's address when it has none) may add REFUSALS_BURST entries at once and one per
REFUSAL_EVERY_S after that, and all sources together TOTAL_BURST at once and TOTAL_PER_S a
second. A refusal past them is only counted: in `arkvory_audit_refusals_total{recorded="no"}`,
and in the next entry its source gets (`details.notRecordedBefore`). At most MAX_SOURCES sources
are remembered (the least recent goes first), so the memory is bounded too.

The entry is written after the answer was sent, in a transaction of its own (there is no
change to share one with); a database that fails then costs the entry, never the answer.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from arkvory.shared.auth.identity import Principal
from arkvory.shared.db import pooled
from arkvory.shared.http.client_address import client_address

from ..request_inputs import PRINCIPAL_KEY
from .actions import refused_entry, route_of
from .trail import Actor, actor_of, record

log = logging.getLogger("arkvory.audit")

REFUSALS_BURST = 20
REFUSAL_EVERY_S = 30.0
TOTAL_BURST = 200
TOTAL_PER_S = 2.0
MAX_SOURCES = 10_000
# The account a failed sign-in tried, set by the login route only when that account exists.
SUBJECT_KEY = "arkvory.audit.subject"
_SIGN_IN = ("POST", "/api/v1/login")
_ANONYMOUS = Actor("anonymous", "anonymous")


@dataclasses.dataclass
class _Bucket:
    tokens: float
    at: float
    dropped: int = 0

    def take(self, now: float, burst: float, per_second: float) -> bool:
        self.tokens = min(burst, self.tokens + (now - self.at) * per_second)
        self.at = now
        return self.tokens >= 1


class RefusalLimits:
    """The token buckets of the module docstring; `admit(source)` says whether to record one
    more refusal of `source`, and how many of its refusals went unrecorded before it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        now = clock()
        self._total = _Bucket(TOTAL_BURST, now)
        self._sources: OrderedDict[str, _Bucket] = OrderedDict()

    def admit(self, source: str) -> tuple[bool, int]:
        now = self.clock()
        bucket = self._sources.get(source)
        if bucket is None:
            bucket = self._sources[source] = _Bucket(REFUSALS_BURST, now)
            while len(self._sources) > MAX_SOURCES:
                self._sources.popitem(last=False)
        self._sources.move_to_end(source)
        own = bucket.take(now, REFUSALS_BURST, 1 / REFUSAL_EVERY_S)
        total = self._total.take(now, TOTAL_BURST, TOTAL_PER_S)
        if not (own and total):
            bucket.dropped += 1
            return False, 0
        bucket.tokens -= 1
        self._total.tokens -= 1
        dropped, bucket.dropped = bucket.dropped, 0
        return True, dropped


class RefusalRecorder:
    """The writer's one recorder of refusals (app.state.audit_refusals), with its counter."""

    def __init__(self, registry: CollectorRegistry, limits: RefusalLimits | None = None) -> None:
        self.limits = limits or RefusalLimits()
        self.counted = Counter(
            "arkvory_audit_refusals", "Refused changes seen by the audit, by whether an entry was written"
            " (writer/audit/refusals.py: bounded per principal or address)", ["recorded"], registry=registry,
        )
        for recorded in ("yes", "no"):
            self.counted.labels(recorded)  # 0 from the start

    async def seen(self, request: Request, status: int) -> None:
        principal: Principal | None = request.scope.get(PRINCIPAL_KEY)
        known = principal is not None and not principal.is_anonymous
        sign_in = route_of(request) == _SIGN_IN
        if status == 401 and not (sign_in or known):
            return
        target = request.scope.get(SUBJECT_KEY) if sign_in else None
        found = refused_entry(request, status, target, {})
        if found is None:
            return
        entry, origin = found
        source = principal.id if known else f"address:{origin.client_address}"
        admitted, dropped = self.limits.admit(source)
        self.counted.labels("yes" if admitted else "no").inc()
        if not admitted:
            return
        if dropped:
            entry = dataclasses.replace(entry, details={**(entry.details or {}), "notRecordedBefore": dropped})
        runtime = request.app.state.runtime
        try:
            async with pooled(runtime.pool) as conn:
                await record(conn, actor_of(principal) if known else _ANONYMOUS, entry, origin)
        except Exception as exc:  # the answer was sent; only the entry is lost
            log.warning("the audit entry of a refused %s (%d) from %s was not written: %s: %s", entry.action,
                        status, client_address(request.scope, runtime.settings.trusted_proxies),
                        exc.__class__.__name__, exc)


class AuditRefusals:
    """In the writer's middleware: after a change's answer of 401 or 403, hand the request to
    the app's RefusalRecorder. Reads (GET, HEAD, OPTIONS) pass straight through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        status = 0

        async def watching(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await self.app(scope, receive, watching)
        if status in (401, 403) and "route" in scope:
            recorder: RefusalRecorder = scope["app"].state.audit_refusals
            await recorder.seen(Request(scope, receive), status)
