"""One HTTP connection pool, the base URLs it rotates through, and requests with retries.

The token travels only in the `Authorization` header (SPEC §5): a base URL carrying
credentials is refused, and neither URLs nor log lines ever hold the token. After a failure
that may be the server's (no answer, 5xx, 503 busy) the next attempt goes to the next base URL,
so a list of backends spreads retries; behind one balancer address the balancer picks another.

Writer-only requests (every route but content, SPEC §6) skip the URLs found to be read gateways
(shared/client/routing.py), without spending a retry: a gateway answers a change with
`405 read_only`, and a writer-only GET with the `404 not_found` "no such route" that the writer
also gives a missing artifact, under the same code. A 404 from a URL not yet known is therefore
settled with one `HEAD /api/v1/openapi.json` to it (the writer publishes that document,
anonymously; a gateway does not): a gateway's 404 moves the request on to the next URL, the
writer's is the answer (exit 4 in the CLI). The client learns this rather than the server
marking its "no such route" with a code of its own because it then works with every server
deployed and keeps the error codes of SPEC §6 as they are.

A connection refused by an address that never answered is a wrong address far more often than an
outage: it is tried again at once on the other URLs and once more after REFUSED_PAUSE_S, then
given up (NetworkError naming the URLs) instead of backing off for minutes.
"""

from __future__ import annotations

import socket
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .errors import ClientError, NetworkError, UsageError, error_fields, error_for_response
from .retries import RetryPolicy, Retryable, is_retryable_status, retry_after_seconds
from .routing import REFUSED_ROUNDS, BaseUrls

USER_AGENT = "arkvory-client/1"
# Served by the writer (and through a balancer) to anyone, by no gateway: see the docstring.
WRITER_PROBE = "/api/v1/openapi.json"
PROBE_TIMEOUT_S = 5.0
# The wait before every URL is tried again after each refused a connection.
REFUSED_PAUSE_S = 1.0

if TYPE_CHECKING:
    import httpx


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
        self.urls = BaseUrls(self.base_urls)
        self.retry = retry
        self.sleep = sleep
        headers = {"User-Agent": USER_AGENT}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.timeout = timeout
        self._default_headers = headers
        self._http: httpx.Client | None = None

    @property
    def http(self) -> httpx.Client:
        """The pool for every request but a download's body (shared/client/rawget.py), made on
        first use: importing httpx (with click and pygments) and building its TLS context (the
        CA bundle) is more than half of the instructions of an `arkvory get`'s start, and a
        get -o FILE of an artifact id sends nothing through it."""
        if self._http is None:
            import httpx  # not at the top: see `http`

            self._http = httpx.Client(headers=self._default_headers, timeout=self.timeout, follow_redirects=False)
        return self._http

    # -- base URLs ----------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """The URL the current (or last) request went to."""
        return self.urls.current

    def rotate(self) -> None:
        self.urls.rotate()

    def url(self, path: str) -> str:
        """`path` on the current URL: for the content routes, which every process serves."""
        return self.base_url + path

    def writer_url(self, path: str, what: str) -> str:
        """`path` on the current URL not known to be a read gateway (UsageError if all are)."""
        base = self.urls.for_writer()
        if base is None:
            listed = ", ".join(self.base_urls)
            raise UsageError(
                f"{what}: {listed} {'is a read gateway' if len(self.base_urls) == 1 else 'are read gateways'}"
                " (downloads only); give the writer's or a balancer's URL too (--url, ARKVORY_URL or a"
                " profile's url)"
            )
        return base + path

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
        return error

    def headers(self, extra: Mapping[str, str]) -> dict[str, str]:
        """The headers every request carries (User-Agent, Authorization) plus `extra`, for
        requests sent outside httpx (shared/client/rawget.py)."""
        return {**self._default_headers, **extra}

    def note_answer(self) -> None:
        """The current URL answered (any status): a refusal from it later is an outage."""
        self.urls.answered(self.base_url)

    def network_failure(self, exc: BaseException, what: str, *, writer_only: bool = False) -> Exception:
        """What to raise when the current URL gave no answer: Retryable, or a NetworkError when
        every address given refuses connections and none ever answered (see the docstring)."""
        url = self.base_url
        reason = _unreachable_reason(exc)
        if reason is None:
            return Retryable(NetworkError(f"{what}: no answer from {url}: {_describe(exc)}"))
        verdict = self.urls.refused(url, writer_only)
        if verdict == "give_up":
            tried = self.urls.candidates(writer_only)
            each = " each" if len(tried) > 1 else ""
            return NetworkError(
                f"{what}: nothing answers at {', '.join(tried)} ({reason}, tried {REFUSED_ROUNDS} times{each});"
                " is the address right? (--url, ARKVORY_URL or a profile's url)"
            )
        error = NetworkError(f"{what}: no answer from {url}: {reason}")
        if verdict == "outage":
            return Retryable(error)
        return Retryable(error, 0.0 if verdict == "try_next" else REFUSED_PAUSE_S)

    def send(
        self,
        method: str,
        path: str,
        what: str,
        *,
        writer_only: bool = True,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """One attempt of a request, read whole. A writer-only one skips the URLs that turn out
        to be read gateways (at once: finding the writer is no failure to retry)."""
        import httpx

        while True:  # ends: every pass finds a gateway and marks it, or returns
            url = self.writer_url(path, what) if writer_only else self.url(path)
            try:
                body, body_headers = framed_body(content, headers)
                response = self.http.request(
                    method, url, params=params, json=json, content=body, headers=body_headers
                )
            except httpx.HTTPError as exc:
                raise self.network_failure(exc, what, writer_only=writer_only) from exc
            self.note_answer()
            if not writer_only:
                return response
            if response.is_success:
                self.urls.serving_writer.add(self.base_url)
            elif self._served_elsewhere(response):
                self.urls.read_only.add(self.base_url)
                continue
            return response

    def _served_elsewhere(self, response: httpx.Response) -> bool:
        """Whether this answer to a writer-only request says "not here: I am a read gateway"."""
        status, base = response.status_code, self.base_url
        if status not in (404, 405) or base in self.urls.serving_writer:
            return False
        import httpx

        code = error_fields(response)[0]
        if status == 405:
            return code == "read_only"
        if code not in (None, "not_found"):
            return False
        try:
            probe = self.http.head(base + WRITER_PROBE, timeout=PROBE_TIMEOUT_S)
        except httpx.HTTPError:
            return False  # cannot tell: the 404 stands
        if probe.is_success:
            self.urls.serving_writer.add(base)
        return probe.status_code == 404

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
        writer_only: bool = True,
    ) -> httpx.Response:
        """One logical request, retried by the policy; a 2xx answer, read whole, or an error.
        Every route but content is the writer's (SPEC §6): `writer_only=False` for content."""
        try:
            for attempt in self.attempts(what):
                with attempt:
                    response = self.send(
                        method, path, what, writer_only=writer_only, params=params, json=json,
                        content=content, headers=headers,
                    )
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
        if self._http is not None:
            self._http.close()


# httpcore's blocking send loop (1.0.x) copies the rest of a body after every partial `send`
# (`buffer = buffer[n:]`, encode/httpcore#1029): a 64 MiB part sent to a writer that reads it as
# fast as it stores it is copied over and over, ~1.5 CPU s of memmove and page faults per GiB
# here, more than the sending itself. Handed over in slices, each copy is bounded by a slice;
# the explicit Content-Length keeps it one framed body (httpx would otherwise send an iterable
# chunked), so the server sees the same request.
BODY_SLICE = 1024 * 1024


def framed_body(
    content: bytes | None, headers: Mapping[str, str] | None
) -> tuple[bytes | Iterator[memoryview] | None, Mapping[str, str] | None]:
    """The body and headers to give httpx: a large body as slices under its Content-Length
    (a fresh iterator each call: an attempt that is retried sends it again from the start)."""
    if content is None or len(content) <= BODY_SLICE:
        return content, headers
    return _slices(memoryview(content)), {**(headers or {}), "Content-Length": str(len(content))}


def _slices(view: memoryview) -> Iterator[memoryview]:
    for start in range(0, len(view), BODY_SLICE):
        yield view[start:start + BODY_SLICE]


def _unreachable_reason(exc: BaseException) -> str | None:
    """"connection refused" or "unknown host" when that is why `exc` (or what caused it) got no
    answer; None for every other failure (timeouts, resets, a cut body, a name server down)."""
    seen: BaseException | None = exc
    for _ in range(8):  # the cause chain of httpx's errors is three deep
        if seen is None:
            break
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused"
        if isinstance(seen, socket.gaierror) and seen.errno == socket.EAI_NONAME:
            return "unknown host"
        seen = seen.__cause__ or seen.__context__
    return None


def _describe(exc: BaseException) -> str:
    text = str(exc) or exc.__class__.__name__
    return f"{exc.__class__.__name__}: {text}" if text != exc.__class__.__name__ else text
