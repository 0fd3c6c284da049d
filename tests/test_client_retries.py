"""The client's retries by SPEC §6, against a tiny scripted HTTP server on 127.0.0.1.

Each test scripts the answers (status, headers, body) the server gives in turn and counts the
requests it received: 429/503 wait for Retry-After, 5xx and dropped connections back off,
other 4xx are never retried, attempts and total time are both bounded, and every attempt of a
change carries the same Idempotency-Key.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator

import pytest

from arkvory.shared.client import Client, RetryPolicy, errors
from arkvory.shared.client.retries import Retryable

pytestmark = pytest.mark.timeout(60)

ARTIFACT = {"id": "7d5c3f4e-0000-4000-8000-000000000001", "name": "a.bin", "sha256": "0" * 64, "size": 1}
FAST = RetryPolicy(max_attempts=4, max_total_seconds=30, backoff_initial=0.05, backoff_max=0.1)


class Scripted(http.server.ThreadingHTTPServer):
    """Answers each request with the next scripted answer (the last one repeats)."""

    daemon_threads = True

    def __init__(self, answers: list[tuple[int, dict[str, str], object]]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answers = list(answers)
        self.requests: list[tuple[str, str, dict[str, str], float]] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def next_answer(self) -> tuple[int, dict[str, str], object]:
        with self.lock:
            return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Scripted
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        self.server.requests.append((self.command, self.path, dict(self.headers), time.monotonic()))
        status, headers, body = self.server.next_answer()
        if status == 0:  # drop the connection without an answer
            self.close_connection = True
            self.connection.close()
            return
        raw = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", **headers}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[callable]:
    servers: list[Scripted] = []

    def start(*answers: tuple[int, dict[str, str], object]) -> Scripted:
        server = Scripted(list(answers))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def error(status: int, code: str, **headers: str) -> tuple[int, dict[str, str], object]:
    return status, headers, {"code": code, "message": f"scripted {code}", "requestId": "r1"}


def test_503_with_retry_after_is_waited_for(scripted):
    server = scripted(error(503, "busy", **{"Retry-After": "1"}), (200, {}, ARTIFACT))
    with Client(server.url, "token", retry=FAST) as client:
        started = time.monotonic()
        assert client.stat("builds", ARTIFACT["id"]) == ARTIFACT
        elapsed = time.monotonic() - started
    assert len(server.requests) == 2
    waited = server.requests[1][3] - server.requests[0][3]
    # Retry-After: 1, not the 0.05 s backoff; generous above for a loaded machine.
    assert 0.95 <= waited < 5, waited
    assert elapsed < 10


def test_429_waits_for_retry_after_as_well(scripted):
    server = scripted(error(429, "rate_limited", **{"Retry-After": "1"}), (200, {}, ARTIFACT))
    with Client(server.url, "token", retry=FAST) as client:
        client.stat("builds", ARTIFACT["id"])
    assert len(server.requests) == 2
    assert server.requests[1][3] - server.requests[0][3] >= 0.95


@pytest.mark.parametrize(
    "status, code, kind, exit_code",
    [
        (400, "invalid_input", errors.UsageError, 2),
        (401, "unauthorized", errors.AuthError, 3),
        (403, "forbidden", errors.AuthError, 3),
        (404, "not_found", errors.NotFoundError, 4),
        (409, "conflict", errors.ConflictError, 6),
        (422, "IdempotentParameterMismatch", errors.ConflictError, 6),
        (413, "payload_too_large", errors.ClientError, 1),
    ],
)
def test_other_4xx_are_not_retried(scripted, status, code, kind, exit_code):
    server = scripted(error(status, code), (200, {}, ARTIFACT))
    with Client(server.url, "token", retry=FAST) as client:
        with pytest.raises(kind) as raised:
            client.stat("builds", ARTIFACT["id"])
    assert len(server.requests) == 1
    assert raised.value.exit_code == exit_code
    assert raised.value.status == status and raised.value.code == code
    assert raised.value.request_id == "r1"


@pytest.mark.parametrize("status", [500, 502, 503, 504, 0])
def test_5xx_and_dropped_connections_back_off_then_succeed(scripted, status):
    failure = (status, {}, {"code": "internal", "message": "boom"})
    server = scripted(failure, failure, (200, {}, ARTIFACT))
    with Client(server.url, "token", retry=FAST) as client:
        assert client.stat("builds", ARTIFACT["id"]) == ARTIFACT
    assert len(server.requests) == 3


def test_attempts_are_bounded(scripted):
    server = scripted(error(500, "internal"))
    with Client(server.url, "token", retry=FAST) as client:
        with pytest.raises(errors.NetworkError) as raised:
            client.stat("builds", ARTIFACT["id"])
    assert len(server.requests) == FAST.max_attempts
    assert raised.value.exit_code == 7 and raised.value.status == 500


def test_total_time_is_bounded_even_with_attempts_left(scripted):
    # Retry-After 30 s would end past the 2 s allowed: the client gives up at once, not at 30 s.
    server = scripted(error(503, "busy", **{"Retry-After": "30"}), (200, {}, ARTIFACT))
    policy = RetryPolicy(max_attempts=10, max_total_seconds=2, backoff_initial=0.05, backoff_max=0.1)
    with Client(server.url, "token", retry=policy) as client:
        started = time.monotonic()
        with pytest.raises(errors.NetworkError) as raised:
            client.stat("builds", ARTIFACT["id"])
    assert time.monotonic() - started < 2
    assert len(server.requests) == 1 and raised.value.code == "busy"

    server = scripted(error(500, "internal"))
    policy = RetryPolicy(max_attempts=1000, max_total_seconds=1.5, backoff_initial=0.2, backoff_max=0.2)
    with Client(server.url, "token", retry=policy) as client:
        started = time.monotonic()
        with pytest.raises(errors.NetworkError):
            client.stat("builds", ARTIFACT["id"])
    assert time.monotonic() - started < 5
    assert 2 <= len(server.requests) < 20


def test_a_retried_change_keeps_its_idempotency_key(scripted):
    server = scripted(error(503, "busy", **{"Retry-After": "0"}), (0, {}, None), (204, {}, None))
    with Client(server.url, "token", retry=FAST) as client:
        client.delete("builds", ARTIFACT["id"])
    keys = [headers.get("Idempotency-Key") for _, _, headers, _ in server.requests]
    assert len(keys) == 3 and keys[0] and len(set(keys)) == 1


def test_retries_move_on_to_the_next_base_url(scripted):
    down = scripted(error(503, "unavailable", **{"Retry-After": "0"}))
    up = scripted((200, {}, ARTIFACT))
    with Client([down.url, up.url], "token", retry=FAST) as client:
        assert client.stat("builds", ARTIFACT["id"]) == ARTIFACT
    assert len(down.requests) == 1 and len(up.requests) == 1


def test_the_token_is_sent_in_the_header_only_and_never_shown(scripted, caplog):
    server = scripted(error(500, "internal"), (200, {}, ARTIFACT))
    secret = "arkvory_key_very_secret_value"
    with caplog.at_level("DEBUG"):
        with Client(server.url, secret, retry=FAST) as client:
            client.stat("builds", ARTIFACT["id"])
            assert secret not in repr(client)
    for method, path, headers, _ in server.requests:
        assert headers["Authorization"] == f"Bearer {secret}"
        assert secret not in path
    assert secret not in caplog.text
    with pytest.raises(errors.UsageError) as raised:
        Client("http://user:hunter2@127.0.0.1:1", None)
    assert "hunter2" not in str(raised.value)


def test_policy_checks_its_bounds():
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="backoff_max"):
        RetryPolicy(backoff_initial=2, backoff_max=1)
    # Retryable is what the retry loop retries on; nothing else is.
    assert issubclass(Retryable, Exception) and not issubclass(errors.ClientError, Retryable)


def test_an_answer_that_is_no_upload_session_is_a_clear_error_not_a_crash(scripted, tmp_path):
    """A URL that is not an Arkvory writer (a port another program has taken since) may answer
    JSON of another shape: the upload says the answer was unexpected (exit 1), never a KeyError."""
    server = scripted((201, {}, {"id": "not-a-session", "items": []}))
    path = tmp_path / "a.bin"
    path.write_bytes(b"x" * 1000)
    with Client(server.url, "token", retry=FAST) as client, pytest.raises(errors.ClientError) as raised:
        client.upload("builds", path)
    assert type(raised.value) is errors.ClientError and raised.value.exit_code == 1
    assert "unexpected answer (no upload session: 'status' missing or wrong)" in str(raised.value)
