"""When and how long the client retries (SPEC §6), built on tenacity.

    answer                        retried?
    2xx                           never
    429, 503 with Retry-After     yes, after Retry-After (if it ends within the time left)
    500, 502, 503, 504            yes, exponential backoff with jitter
    no answer (connect, reset,    yes, exponential backoff with jitter
      timeout, body cut short)
    409 idempotency_key_in_use    yes, with backoff: our own earlier attempt still runs, and a
                                  retry then replays its result
    any other 4xx                 never: it will not change until the request does
    connection refused by an      on each other URL at once, then once more after 1 s, then
      address that never answered   given up: a wrong address, not an outage (transport.py)

Every retry sequence is bounded by `max_attempts` *and* `max_total_seconds` (whichever comes
first). A sequence is the attempts in a row that made no progress: a download that receives
bytes before its connection is cut, or an upload whose part was stored, starts a fresh sequence,
so a long transfer cut now and then is not given up while it is still moving forward.
"""

from __future__ import annotations

import dataclasses
import email.utils
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import tenacity

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("arkvory.client")

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# A Retry-After beyond this is not trusted literally (a misconfigured proxy could say a day).
RETRY_AFTER_CAP_S = 3600.0


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Bounds of one retry sequence: attempts (the first included) and seconds since it began;
    backoff for answers without Retry-After grows from `backoff_initial` to `backoff_max`."""

    max_attempts: int = 8
    max_total_seconds: float = 300.0
    backoff_initial: float = 0.5
    backoff_max: float = 30.0

    def __post_init__(self) -> None:
        problems = []
        if self.max_attempts < 1:
            problems.append(f"max_attempts: expected 1 or more, got {self.max_attempts!r}")
        if not self.max_total_seconds > 0:
            problems.append(f"max_total_seconds: expected more than 0, got {self.max_total_seconds!r}")
        if self.backoff_initial < 0:
            problems.append(f"backoff_initial: expected 0 or more, got {self.backoff_initial!r}")
        if self.backoff_max < self.backoff_initial:
            problems.append(
                f"backoff_max: expected at least backoff_initial ({self.backoff_initial}), got {self.backoff_max!r}"
            )
        if problems:
            raise ValueError("RetryPolicy: " + "; ".join(problems))

    def retrying(
        self, what: str, *, sleep: Callable[[float], None] = time.sleep
    ) -> tenacity.Retrying:
        """A tenacity loop for one sequence; the last error is re-raised when it gives up."""
        return tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(Retryable),
            stop=tenacity.stop_after_attempt(self.max_attempts)
            | tenacity.stop_before_delay(self.max_total_seconds),
            wait=_ServerSaysOrBackoff(
                tenacity.wait_exponential_jitter(
                    multiplier=self.backoff_initial, max=self.backoff_max, jitter=self.backoff_initial
                )
            ),
            before_sleep=_log_retry(what),
            sleep=sleep,
            reraise=True,
        )


class Retryable(Exception):
    """A failure worth another attempt: no answer, or a 429/5xx answer.

    `error` is what the caller sees if no attempt is left; `retry_after` the server's wait."""

    def __init__(self, error: Exception, retry_after: float | None = None, *, rotate: bool = True) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after
        # Whether the next attempt should try another base URL (the server may be the problem).
        self.rotate = rotate


def retry_after_seconds(response: httpx.Response) -> float | None:
    """Retry-After as seconds (RFC 9110: delta-seconds or an HTTP date), or None."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), RETRY_AFTER_CAP_S)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return min(max(0.0, when.timestamp() - time.time()), RETRY_AFTER_CAP_S)


def is_retryable_status(status: int) -> bool:
    return status in RETRY_STATUSES


class _ServerSaysOrBackoff(tenacity.wait.wait_base):
    """Retry-After when the server sent one (429, 503), else the exponential backoff.

    A Retry-After longer than the time left makes `stop_before_delay` give up at once, instead
    of sleeping only to fail at the deadline."""

    def __init__(self, backoff: tenacity.wait.wait_base) -> None:
        self.backoff = backoff

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        outcome = retry_state.outcome
        error = outcome.exception() if outcome is not None else None
        if isinstance(error, Retryable) and error.retry_after is not None:
            return error.retry_after
        return self.backoff(retry_state)


def _log_retry(what: str) -> Callable[[tenacity.RetryCallState], None]:
    def before_sleep(retry_state: tenacity.RetryCallState) -> None:
        outcome = retry_state.outcome
        error = outcome.exception() if outcome is not None else None
        wait = retry_state.next_action.sleep if retry_state.next_action else 0.0
        # The message names the request and the cause; URLs carry no credential (SPEC §5).
        log.info("%s: attempt %d failed (%s); retrying in %.1f s", what, retry_state.attempt_number, error, wait)

    return before_sleep
