"""The one error tree of Arkvory; the HTTP edge turns an `ApiError` into the JSON of SPEC §6.

    Exception
    ├── ApiError                   (status, code; answered as JSON)
    │   ├── InvalidInput           400 invalid_input
    │   ├── Unauthorized           401 unauthorized
    │   ├── Forbidden              403 forbidden
    │   │   └── PasswordChangeRequired 403 password_change_required (an administrator reset the
    │   │                                  account's password: its session may only set a new one)
    │   ├── NotFound               404 not_found
    │   ├── MethodNotAllowed       405 method_not_allowed (writer: Allow lists the path's methods)
    │   ├── ReadOnly               405 read_only      (gateway: Allow: GET, HEAD)
    │   ├── RequestTimeout         408 request_timeout (a body sent no byte for the receive timeout)
    │   ├── Conflict               409 conflict
    │   ├── IdempotencyKeyInUse    409 idempotency_key_in_use (the first request with the key still runs)
    │   ├── PayloadTooLarge        413 payload_too_large
    │   ├── UnsupportedMediaType   415 unsupported_media_type (a multipart form sent as an upload)
    │   ├── RangeNotSatisfiable    416 range_not_satisfiable
    │   ├── IdempotentParameterMismatch 422 IdempotentParameterMismatch (a used key, other parameters)
    │   ├── DigestMismatch         422 digest_mismatch (the bytes are not the declared SHA-256)
    │   ├── RateLimited            429 rate_limited   (Retry-After)
    │   ├── RequestHeaderTooLarge  431 request_header_too_large
    │   ├── InsufficientStorage    507 insufficient_storage (disk full or below the free-space reserve)
    │   ├── Busy                   503 busy           (Retry-After)
    │   ├── Unavailable            503 unavailable    (Retry-After)
    │   └── ContentUnavailable     503 content_unavailable (Retry-After: the blob is missing or
    │                                                     quarantined; re-uploading it restores it)
    └── StartupError               (exit_status; the process refuses to start)
        ├── PortUnavailable        exit 1: the port cannot be bound (in use)
        ├── SlotBusy               exit 3: another holder still renews the slot
        ├── DatabaseUnavailable    exit 69: cannot reach the database (a restart may help)
        │   └── DatabaseRefused    exit 78: the database refuses us (credentials, role, database
        │                                   name, pg_hba.conf): a restart will not help
        ├── StorageUnreachable     exit 69: cannot reach the object store (a restart may help)
        └── StartupRefused         exit 78: storage, policy or schema do not match
"""

from __future__ import annotations


class ApiError(Exception):
    status = 500
    code = "internal"
    retry_after: int | None = None

    def __init__(self, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if retry_after is not None:
            self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(self.retry_after)}

    def header_pairs(self) -> list[tuple[str, str]]:
        """`headers()` as (name, value) pairs, where a name may repeat: what an API answer sends."""
        return list(self.headers().items())


class InvalidInput(ApiError):
    status, code = 400, "invalid_input"


BASIC_CHALLENGE = 'Basic realm="arkvory", charset="UTF-8"'
BEARER_CHALLENGE = 'Bearer realm="arkvory"'


class Unauthorized(ApiError):
    """An API 401 challenges for Basic as well as Bearer (shared/auth/authorization.py): wget,
    git and others send their credentials only after a Basic challenge."""

    status, code = 401, "unauthorized"

    def headers(self) -> dict[str, str]:
        # What the console's pages send (one value per name): no Basic challenge there, or a
        # browser would open its password dialog over a page that signs in with its own form.
        return {"WWW-Authenticate": BEARER_CHALLENGE}

    def header_pairs(self) -> list[tuple[str, str]]:
        # Two header fields, Basic first: clients that read only the first field, or one
        # challenge per field (wget, browsers), still find Basic.
        return [("WWW-Authenticate", BASIC_CHALLENGE), ("WWW-Authenticate", BEARER_CHALLENGE)]


class Forbidden(ApiError):
    status, code = 403, "forbidden"


class PasswordChangeRequired(Forbidden):
    code = "password_change_required"


class NotFound(ApiError):
    status, code = 404, "not_found"


class ReadOnly(ApiError):
    status, code = 405, "read_only"

    def headers(self) -> dict[str, str]:
        return {"Allow": "GET, HEAD"}


class MethodNotAllowed(ApiError):
    status, code = 405, "method_not_allowed"

    def __init__(self, message: str, allow: list[str]) -> None:
        super().__init__(message)
        self.allow = allow

    def headers(self) -> dict[str, str]:
        return {"Allow": ", ".join(self.allow)}


class RequestTimeout(ApiError):
    """The client stopped sending its body; the connection is closed after the answer."""

    status, code = 408, "request_timeout"

    def headers(self) -> dict[str, str]:
        return {"Connection": "close"}


class Conflict(ApiError):
    status, code = 409, "conflict"


class IdempotencyKeyInUse(ApiError):
    status, code = 409, "idempotency_key_in_use"


class IdempotentParameterMismatch(ApiError):
    status, code = 422, "IdempotentParameterMismatch"


class UnsupportedMediaType(ApiError):
    status, code = 415, "unsupported_media_type"

    def headers(self) -> dict[str, str]:
        return {"Connection": "close"}  # the unread form body is not worth receiving


class DigestMismatch(ApiError):
    """The bytes received do not have the SHA-256 the client declared; nothing was kept."""

    status, code = 422, "digest_mismatch"


class RateLimited(ApiError):
    status, code = 429, "rate_limited"


class PayloadTooLarge(ApiError):
    """The body was not (fully) read: closing the connection spares reading the rest."""

    status, code = 413, "payload_too_large"

    def headers(self) -> dict[str, str]:
        return {"Connection": "close"}


class RangeNotSatisfiable(ApiError):
    status, code = 416, "range_not_satisfiable"

    def __init__(self, size: int) -> None:
        super().__init__(f"the range is outside the artifact's {size} bytes")
        self.size = size

    def headers(self) -> dict[str, str]:
        return {"Content-Range": f"bytes */{self.size}"}


class RequestHeaderTooLarge(ApiError):
    status, code = 431, "request_header_too_large"

    def headers(self) -> dict[str, str]:
        return {"Connection": "close"}


class InsufficientStorage(ApiError):
    """The storage directory is full or would fall below ARKVORY_MIN_FREE_BYTES; nothing was kept."""

    status, code = 507, "insufficient_storage"

    def headers(self) -> dict[str, str]:
        return {"Connection": "close"}  # the rest of an upload body is not worth reading


class Busy(ApiError):
    status, code, retry_after = 503, "busy", 2


class Unavailable(ApiError):
    status, code, retry_after = 503, "unavailable", 2


class ContentUnavailable(ApiError):
    """The artifact is known but its stored file is missing or was quarantined as corrupt: never
    a partial or wrong body. Retry-After is long because only a re-upload (or an operator) fixes it."""

    status, code, retry_after = 503, "content_unavailable", 60


class StartupError(Exception):
    """The process must not serve; `exit_status` tells the service manager why."""

    exit_status = 1


class SlotBusy(StartupError):
    exit_status = 3


class PortUnavailable(StartupError):
    """The process's port cannot be bound (in use, or not ours to take)."""

    exit_status = 1


class DatabaseUnavailable(StartupError):
    exit_status = 69  # EX_UNAVAILABLE: transient, the service manager may retry


class DatabaseRefused(DatabaseUnavailable):
    """The server answered and will not take us: restarting will not help until an operator
    acts. A DatabaseUnavailable still, so that a running process's reconnect loops, which retry
    an unavailable database, treat a password changed under them the same way."""

    exit_status = 78  # EX_CONFIG, as StartupRefused


class StorageUnreachable(StartupError):
    exit_status = 69  # the object store did not answer: transient like the database


class StartupRefused(StartupError):
    exit_status = 78  # EX_CONFIG: restarting will not help until an operator acts


class TransferAborted(Exception):
    """A response was cut on purpose after it started (lease lost, blob shorter than recorded)."""


class LeaseLost(Exception):
    """The slot lease is no longer trusted: no further payload may be handed out."""
