"""The upload form without its script: a browser's `multipart/form-data` body, parsed as it
streams, its file part handed on as it arrives to the API's one-shot upload
(`POST /api/v1/repositories/{repo}/artifacts`), never held in memory or spooled elsewhere.

With the script (static/upload.js) the browser uses the resumable upload API itself and shows
progress; this path is what the same form does when the script is off.

Bounds before any work: the body must declare its length, at most ARKVORY_MAX_ARTIFACT_BYTES
plus `MAX_ENVELOPE_BYTES` for the fields and boundaries; at most `MAX_FIELD_BYTES` per field and
`MAX_PART_HEADER_BYTES` of headers per part; fields only from the form (`csrf`, `key`, `name`,
then `file`), each once. The CSRF field must come before the file (the form puts it first): the
file is streamed only once it checked out. The artifact's size and digest limits, the upload
places and the per-principal shares are the API's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request
from starlette.responses import Response

from arkvory.shared.auth.credentials import SESSION_COOKIE
from arkvory.shared.errors import Forbidden, InvalidInput, PayloadTooLarge, UnsupportedMediaType
from arkvory.shared.http.bodies import body_chunks, declared_length

from .internal import api_path
from .security import CSRF_FIELD, csrf_matches
from .session import api_for, runtime_of, see_other, sign_in_redirect, signed_in

MAX_ENVELOPE_BYTES = 64 * 1024
MAX_FIELD_BYTES = 4096
MAX_PART_HEADER_BYTES = 4096
FIELDS = (CSRF_FIELD, "key", "name")
FILE_FIELD = "file"


class _Envelope:
    """The parser's callbacks: the small fields, and the file part's bytes as they come."""

    def __init__(self) -> None:
        self.fields: dict[str, str] = {}
        self.file_started = False
        self.file_ended = False
        self.filename = ""
        self.file_type: str | None = None
        self.pending: list[bytes] = []  # file bytes parsed but not yet handed on
        self._headers: dict[bytes, bytes] = {}
        self._header_field = b""
        self._header_value = b""
        self._header_bytes = 0
        self._name: str | None = None
        self._value = bytearray()

    def callbacks(self) -> dict:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": self._header_field_data,
            "on_header_value": self._header_value_data,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        }

    def _part_begin(self) -> None:
        if self.file_started:
            raise InvalidInput("the file must be the form's last field")
        self._headers, self._header_bytes, self._name = {}, 0, None
        self._value = bytearray()

    def _count_header(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > MAX_PART_HEADER_BYTES:
            raise InvalidInput(f"a form part may have at most {MAX_PART_HEADER_BYTES} bytes of headers")

    def _header_field_data(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self._header_field += data[start:end]

    def _header_value_data(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        self._headers[self._header_field.lower()] = self._header_value
        self._header_field, self._header_value = b"", b""

    def _headers_finished(self) -> None:
        disposition, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        name = options.get(b"name")
        if disposition != b"form-data" or name is None:
            raise InvalidInput("each form part needs Content-Disposition: form-data with a name")
        self._name = _text(name, "a field name")
        if self._name == FILE_FIELD:
            self.file_started = True
            self.filename = _text(options.get(b"filename", b""), "the file name")
            content_type = self._headers.get(b"content-type")
            self.file_type = _text(content_type, "the file's type") if content_type else None
        elif self._name not in FIELDS:
            raise InvalidInput(f"unknown form field {self._name!r}")
        elif self._name in self.fields:
            raise InvalidInput(f"the field {self._name!r} was sent twice")

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._name == FILE_FIELD:
            self.pending.append(bytes(data[start:end]))
            return
        self._value += data[start:end]
        if len(self._value) > MAX_FIELD_BYTES:
            raise InvalidInput(f"a form field may have at most {MAX_FIELD_BYTES} bytes")

    def _part_end(self) -> None:
        if self._name == FILE_FIELD:
            self.file_ended = True
        elif self._name is not None:
            self.fields[self._name] = _text(bytes(self._value), f"the field {self._name!r}")


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"{what} is not valid UTF-8") from None


def _boundary(request: Request) -> bytes:
    content_type, options = parse_options_header(request.headers.get("content-type") or "")
    boundary = options.get(b"boundary")
    if content_type != b"multipart/form-data" or not boundary or len(boundary) > 200:
        raise UnsupportedMediaType("the upload form is sent as multipart/form-data")
    return boundary


async def upload_form(request: Request) -> Response:
    """POST /console/repositories/{repo}/upload."""
    runtime = runtime_of(request)
    settings = runtime.settings
    boundary = _boundary(request)
    declared = declared_length(request)
    if declared is None:
        raise InvalidInput("an upload form must declare its Content-Length")
    if declared == 0:
        raise InvalidInput("the form holds no file")
    if declared > settings.max_artifact_bytes + MAX_ENVELOPE_BYTES:
        raise PayloadTooLarge(f"an artifact may have at most {settings.max_artifact_bytes} bytes (ARKVORY_MAX_ARTIFACT_BYTES)")
    envelope = _Envelope()
    parser = MultipartParser(boundary, envelope.callbacks(), max_size=declared)
    chunks = body_chunks(request, settings.receive_timeout_s).__aiter__()

    def feed(chunk: bytes) -> None:
        try:
            parser.write(chunk)
        except MultipartParseError:
            raise InvalidInput("the form's multipart body is malformed") from None

    # The fields before the file: the CSRF token first of all.
    while not envelope.file_started:
        try:
            chunk = await chunks.__anext__()
        except StopAsyncIteration:
            raise InvalidInput("the form holds no file") from None
        feed(chunk)
    if not csrf_matches(request.cookies.get(SESSION_COOKIE), envelope.fields.get(CSRF_FIELD)):
        raise Forbidden("this form's CSRF token is missing or wrong: reload the page and send it again")
    user = await signed_in(request)
    if user is None:
        return sign_in_redirect(request)
    repo = request.path_params["repo"]
    name = envelope.fields.get("name") or envelope.filename

    async def file_bytes() -> AsyncIterator[bytes]:
        while True:
            while envelope.pending:
                yield envelope.pending.pop(0)
            if envelope.file_ended:
                break
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                raise InvalidInput("the form ended inside its file") from None
            feed(chunk)
        async for chunk in chunks:  # the closing boundary
            feed(chunk)

    query = {"name": name}
    if envelope.file_type and envelope.file_type != "application/octet-stream":
        query["mediaType"] = envelope.file_type
    headers = [("content-type", "application/octet-stream")]
    if envelope.fields.get("key"):
        headers.append(("idempotency-key", envelope.fields["key"]))
    answer = await api_for(request, user).call(
        "POST", api_path("repositories", repo, "artifacts"), query=query, stream=file_bytes(), headers=headers
    )
    if answer.status >= 400:
        raise answer.refusal()
    artifact = answer.json()
    return see_other(f"/console/repositories/{repo}/artifacts/{artifact['id']}", "uploaded")

