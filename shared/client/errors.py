"""The client's errors, one class per cause, each with the CLI exit status it maps to.

    ClientError            exit 1  any other refusal (405, 413, 415, 507, ...)
    ├── UsageError         exit 2  the request itself is wrong (400 invalid_input, bad arguments)
    ├── AuthError          exit 3  401 unauthorized, 403 forbidden
    ├── NotFoundError      exit 4  404 not_found (also: a repository you may not read)
    ├── IntegrityError     exit 5  the bytes are not what they claim: SHA-256 or size mismatch
    ├── ConflictError      exit 6  409 conflict / idempotency_key_in_use, 422 IdempotentParameterMismatch
    ├── NetworkError       exit 7  no answer, or 429/5xx/busy, after every retry allowed (SPEC §6)
    └── LocalIOError       exit 8  the local file cannot be read or written

Server errors are translated once, at the edge (`error_for_response`), from the status and the
JSON `code` of SPEC §6, never from the message text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx


class ClientError(Exception):
    """A request that did not succeed; `exit_code` is the CLI's exit status for it."""

    exit_code = 1

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.request_id = request_id

    def __str__(self) -> str:
        details = [f"HTTP {self.status}" if self.status else "", self.code or ""]
        if self.request_id:
            details.append(f"request {self.request_id}")
        shown = ", ".join(d for d in details if d)
        return f"{self.message} ({shown})" if shown else self.message


class UsageError(ClientError):
    exit_code = 2


class AuthError(ClientError):
    exit_code = 3


class NotFoundError(ClientError):
    exit_code = 4


class IntegrityError(ClientError):
    exit_code = 5


class ConflictError(ClientError):
    exit_code = 6


class NetworkError(ClientError):
    exit_code = 7


class LocalIOError(ClientError):
    exit_code = 8


_BY_STATUS: dict[int, type[ClientError]] = {
    400: UsageError,
    401: AuthError,
    403: AuthError,
    404: NotFoundError,
    409: ConflictError,
    429: NetworkError,
    500: NetworkError,
    502: NetworkError,
    503: NetworkError,
    504: NetworkError,
}
_BY_CODE: dict[str, type[ClientError]] = {
    "IdempotentParameterMismatch": ConflictError,
    "digest_mismatch": IntegrityError,
}


def error_fields(response: httpx.Response) -> tuple[str | None, str, str | None]:
    """(code, message, requestId) of an error answer: the JSON body of SPEC §6, or what we can say."""
    code, message, request_id = None, "", response.headers.get("x-request-id")
    try:
        body: Any = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        code = body.get("code") if isinstance(body.get("code"), str) else None
        message = body.get("message") if isinstance(body.get("message"), str) else ""
        if request_id is None and isinstance(body.get("requestId"), str):
            request_id = body["requestId"]
    return code, message or response.reason_phrase or f"HTTP {response.status_code}", request_id


def error_for_response(response: httpx.Response, what: str) -> ClientError:
    """The error for a refused request; `what` says which (e.g. "upload part 3")."""
    code, message, request_id = error_fields(response)
    kind = _BY_CODE.get(code or "") or _BY_STATUS.get(response.status_code, ClientError)
    if response.status_code >= 500 and kind is ClientError:
        kind = NetworkError if response.status_code != 507 else ClientError
    return kind(
        f"{what}: {message}",
        status=response.status_code,
        code=code,
        request_id=request_id,
    )
