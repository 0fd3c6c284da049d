"""One HTTP connection pool, the base URLs it rotates through, and requests with retries.

The token travels only in the `Authorization` header (SPEC §5): a base URL carrying
credentials is refused, and neither URLs nor log lines ever hold the token. After a failure
that may be the server's (no answer, 5xx, 503 busy) the next attempt goes to the next base URL,
so a list of backends spreads retries; behind one balancer address the balancer picks another.
A `405 read_only` means a gateway was asked for a change: the request moves on to the next URL
(list the writer or the balancer first).
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from .errors import ClientError, NetworkError, UsageError, error_fields, error_for_response
from .retries import RetryPolicy, Retryable, is_retryable_status, retry_after_seconds

USER_AGENT = "arkvory-client/1"


def parse_base_urls(base_urls: str | Sequence[str]) -> list[str]:
    """`http(s)://host[:port][/prefix]` URLs, from a list or one comma-separated string."""
    raw = base_urls.split(",") if isinstance(base_urls, str) else list(base_urls)
    urls = []
    for value in raw:
        value = value.strip()
        if not value:
            continue
        parts = urllib.parse.urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"base URL: expected http(s)://host[:port], got {value!r}")
        if parts.username is not None or parts.password is not None:
            # Never echo it: the userinfo may be a secret.
            raise UsageError("base URL: credentials do not belong in a URL; pass the token instead")
        if parts.query or parts.fragment:
            raise UsageError(f"base URL: expected no query or fragment, got {value!r}")
        urls.append(value.rstrip("/"))
    if not urls:
        raise UsageError("no server URL given")
    return urls


class Transport:
    """Requests against a list of base URLs, each retried by the policy (SPEC §6)."""

    def __init__(
        self,
        base_urls: str | Sequence[str],
        token: str | None,
        *,
        retry: RetryPolicy,
        timeout: float,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base_urls = parse_base_urls(base_urls)
        self.retry = retry
        self.sleep = sleep
        self._current = 0
        headers = {"User-Agent": USER_AGENT}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.timeout = timeout
        self._default_headers = headers
        self.http = httpx.Client(headers=headers, timeout=timeout, follow_redirects=False)

    # -- base URLs ----------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return self.base_urls[self._current % len(self.base_urls)]

    def rotate(self) -> None:
        self._current = (self._current + 1) % len(self.base_urls)

    def url(self, path: str) -> str:
        return self.base_url + path

    # -- answers ------------------------------------------------------------------------------

    def refusal(self, response: httpx.Response, what: str) -> Exception:
        """The exception for a non-2xx answer: `Retryable` when SPEC §6 says to retry."""
        error = error_for_response(response, what)
        if is_retryable_status(response.status_code):
            wait = retry_after_seconds(response) if response.status_code in (429, 503) else None
            return Retryable(error, wait, rotate=response.status_code != 429)
        code = error_fields(response)[0]
        if response.status_code == 409 and code == "idempotency_key_in_use":
            # Our own earlier attempt with this key is still running: wait for it, then replay.
            return Retryable(error, None, rotate=False)
        if response.status_code == 405 and len(self.base_urls) > 1 and code == "read_only":
            return Retryable(error, 0.0)
        return error

    def headers(self, extra: Mapping[str, str]) -> dict[str, str]:
        """The headers every request carries (User-Agent, Authorization) plus `extra`, for
        requests sent outside httpx (shared/client/rawget.py)."""
        return {**self._default_headers, **extra}

    def network_failure(self, exc: BaseException, what: str) -> Retryable:
        return Retryable(NetworkError(f"{what}: {_describe(exc)}"))

    def attempts(self, what: str):
        """Iterate tenacity attempts; a failed one that blames the server rotates the URL."""
        for attempt in self.retry.retrying(what, sleep=self.sleep):
            yield attempt
            outcome = attempt.retry_state.outcome
            error = outcome.exception() if outcome is not None and outcome.failed else None
            if isinstance(error, Retryable) and error.rotate:
                self.rotate()

    def request(
        self,
        method: str,
        path: str,
        what: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """One logical request, retried by the policy; a 2xx answer, read whole, or an error."""
        try:
            for attempt in self.attempts(what):
                with attempt:
                    try:
                        response = self.http.request(
                            method, self.url(path), params=params, json=json, content=content, headers=headers
                        )
                    except httpx.HTTPError as exc:
                        raise self.network_failure(exc, what) from exc
                    if response.is_success:
                        return response
                    raise self.refusal(response, what)
        except Retryable as exc:
            raise exc.error from None
        raise AssertionError("unreachable: tenacity either returns or raises")

    def json(self, method: str, path: str, what: str, **kwargs: Any) -> Any:
        response = self.request(method, path, what, **kwargs)
        try:
            return response.json()
        except ValueError:
            raise ClientError(f"{what}: the server's answer is not JSON", status=response.status_code) from None

    def close(self) -> None:
        self.http.close()


def _describe(exc: BaseException) -> str:
    text = str(exc) or exc.__class__.__name__
    return f"{exc.__class__.__name__}: {text}" if text != exc.__class__.__name__ else text
