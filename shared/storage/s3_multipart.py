"""The object store's incomplete multipart uploads: S3 ListMultipartUploads, ListParts and
AbortMultipartUpload, which obstore cannot make (docs/s3-client-choice.md), as SigV4-signed
requests of the standard library (sigv4.py) to the bucket, endpoint, region and credentials obstore
uses (shared/settings.py `ObjectStoreSettings`). Cleanup aborts with them the publications that
a stopped writer left behind (writer/maintenance/multipart_uploads.py).

What it supports, and what not:
- **Credentials**: the static keys AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, with
  AWS_SESSION_TOKEN when set. Not the rest of the AWS credential chain that obstore follows
  when they are unset (instance profile, web identity, config files): `unsupported` then says
  why, and the caller skips its work (the bucket's lifecycle rule stays the only remover).
- **Transport**: an https endpoint (AWS's when ARKVORY_S3_ENDPOINT_URL is unset, path-style as
  obstore's requests) verified against the system's trust store (Python's ssl defaults, which
  honour SSL_CERT_FILE / SSL_CERT_DIR), plain http only where the endpoint says http://; the
  environment's HTTP(S)_PROXY / NO_PROXY, as obstore honours them. No redirect is followed: a
  signed request goes to the endpoint and nowhere else.
- **Bounds**: an answer may have at most MAX_ANSWER_BYTES, read within REQUEST_TIMEOUT_S (each
  receive within the store's read timeout), and its XML is refused before parsing when it is
  not UTF-8 or carries a DTD (which could declare entities): the store is a network peer.
  Listings go by pages of PAGE_SIZE, at most MAX_PAGES per walk.

Keys given and returned are relative to the prefix, as s3_client.py's. Errors are the storage
errors (interface.py), one line naming the setting or permission to look at, never a secret
nor a signed URL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import email.utils
import http.client
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from typing import Any
from xml.etree import ElementTree

from arkvory.shared.settings import AWS_ACCESS_KEY_ID as ACCESS_KEY, ObjectStoreSettings

from .interface import BlobNotFound, Offload, StorageError, StorageRefused, StorageUnavailable
from .s3_client import ENDPOINT_URL, classify_answer
from .sigv4 import signed_request

KiB, MiB = 1024, 1024 * 1024
# A page of 1,000 uploads from AWS (owner, initiator, storage class each) is ~0.6 MB.
MAX_ANSWER_BYTES = 4 * MiB
MAX_ERROR_BYTES = 64 * KiB  # of an error answer: its code is in the first few hundred bytes
READ_CHUNK = 64 * KiB
REQUEST_TIMEOUT_S = 60.0
PAGE_SIZE = 1000  # S3's own maximum of max-uploads and max-parts
MAX_PAGES = 10_000  # of one walk of the uploads: ten million, far beyond any bucket of ours
MAX_PART_PAGES = 10  # S3 allows 10,000 parts to an upload
MAX_UPLOAD_ID = 1024  # characters; AWS's are ~100, SeaweedFS's ~70
PERMISSIONS = "s3:ListBucketMultipartUploads, s3:ListMultipartUploadParts and s3:AbortMultipartUpload"


@dataclasses.dataclass(frozen=True)
class IncompleteUpload:
    """A multipart upload that was neither completed nor aborted."""

    key: str  # relative to the prefix
    upload_id: str
    initiated: datetime.datetime


@dataclasses.dataclass(frozen=True)
class UploadsPage:
    uploads: list[IncompleteUpload]
    # The store's clock when it answered (its Date header; ours when it sent none): ages are
    # judged by it, so a host whose clock is off aborts nothing early.
    store_time: datetime.datetime


@dataclasses.dataclass(frozen=True)
class UploadParts:
    """What the parts of an upload show: how many, their bytes, when the newest arrived."""

    count: int
    bytes: int
    last_part: datetime.datetime | None
    store_time: datetime.datetime


class MultipartUploads:
    """The incomplete multipart uploads of one bucket (and prefix)."""

    def __init__(
        self, settings: ObjectStoreSettings, *, read_timeout: float = 30.0,
        request_timeout: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.settings = settings
        self._prefix = settings.prefix + "/" if settings.prefix else ""
        self._endpoint = settings.endpoint_url or f"https://s3.{settings.region}.amazonaws.com"
        self._read_timeout = read_timeout
        self._request_timeout = request_timeout
        self._open = _opener().open

    @property
    def unsupported(self) -> str | None:
        """Why these requests cannot be made here (None when they can)."""
        if self.settings.access_key_id is None or self.settings.secret_access_key is None:
            return (
                f"{ACCESS_KEY} is not set: the requests obstore cannot make (listing and aborting"
                " incomplete multipart uploads) are signed here with static keys only"
                f" ({ACCESS_KEY} / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN), not with the rest of"
                " the AWS credential chain"
            )
        return None

    async def pages(self, prefix: str, *, offload: Offload | None = None) -> AsyncIterator[UploadsPage]:
        """Pages of the incomplete uploads whose keys start with `prefix` (relative to ours).
        The store pages by its markers: AWS in key order (NextKeyMarker and
        NextUploadIdMarker), SeaweedFS by upload id alone (NextUploadIdMarker): the next page
        asks with the markers the last one gave."""
        full_prefix = self._prefix + prefix
        markers: dict[str, str] = {}
        for _ in range(MAX_PAGES):
            query = {"uploads": "", "prefix": full_prefix, "max-uploads": str(PAGE_SIZE), **markers}
            answer = await self._call("GET", "", query, "list the incomplete multipart uploads of", offload)
            root = _xml(answer.body, self._unavailable, "listing of incomplete multipart uploads")
            uploads = [u for u in (self._upload(e) for e in _children(root, "Upload")) if u is not None]
            yield UploadsPage(uploads, answer.store_time)
            if _text(root, "IsTruncated") != "true":
                return
            following = {
                name: value for name, value in (
                    ("key-marker", _text(root, "NextKeyMarker")),
                    ("upload-id-marker", _text(root, "NextUploadIdMarker")),
                ) if value
            }
            if not following or following == markers:
                raise self._unavailable(
                    "list the incomplete multipart uploads of", "its listing said there was more but did not move on"
                )
            markers = following

    async def parts(self, upload: IncompleteUpload, *, offload: Offload | None = None) -> UploadParts:
        """The parts of `upload` received so far (BlobNotFound when it is gone: completed or
        aborted since it was listed)."""
        count = size = 0
        last: datetime.datetime | None = None
        marker: str | None = None
        store_time = datetime.datetime.now(datetime.timezone.utc)
        for _ in range(MAX_PART_PAGES):
            query = {"uploadId": upload.upload_id, "max-parts": str(PAGE_SIZE)}
            if marker:
                query["part-number-marker"] = marker
            answer = await self._call("GET", upload.key, query, "list the parts of", offload)
            store_time = answer.store_time
            root = _xml(answer.body, self._unavailable, "list of parts")
            for part in _children(root, "Part"):
                count += 1
                size += _int(_text(part, "Size"))
                modified = _time(_text(part, "LastModified"))
                if modified is not None and (last is None or modified > last):
                    last = modified
            marker = _text(root, "NextPartNumberMarker")
            if _text(root, "IsTruncated") != "true" or not marker:
                break
        return UploadParts(count, size, last, store_time)

    async def abort(self, upload: IncompleteUpload, *, offload: Offload | None = None) -> None:
        """AbortMultipartUpload: its parts are freed and a later UploadPart or
        CompleteMultipartUpload of it fails (NoSuchUpload). One already gone is fine."""
        try:
            await self._call("DELETE", upload.key, {"uploadId": upload.upload_id}, "abort", offload)
        except BlobNotFound:
            pass

    # --- requests -----------------------------------------------------------------------------

    async def _call(
        self, method: str, key: str, query: dict[str, str], action: str, offload: Offload | None
    ) -> _Answer:
        what = f"{self._prefix}{key}" if key else self.settings.url
        path = f"/{self.settings.bucket}" + (f"/{self._prefix}{key}" if key else "")
        run: Callable[..., Any] = offload or asyncio.to_thread
        try:
            return await asyncio.wait_for(
                run(self._send, method, path, query, action, what), self._request_timeout + self._read_timeout
            )
        except asyncio.TimeoutError:
            raise self._unavailable(f"{action} {what}", "timed out") from None

    def _send(self, method: str, path: str, query: dict[str, str], action: str, what: str) -> _Answer:
        """A worker thread: the signed request and its answer, read within the bounds."""
        s = self.settings
        request = signed_request(
            method, self._endpoint, path, query=query, region=s.region,
            access_key_id=s.access_key_id or "", secret_access_key=s.secret_access_key or "",
            session_token=s.session_token, now=datetime.datetime.now(datetime.timezone.utc),
        )
        deadline = time.monotonic() + self._request_timeout
        try:
            try:
                response = self._open(request, timeout=self._read_timeout)
            except urllib.error.HTTPError as exc:
                with exc:
                    body = _read(exc, MAX_ERROR_BYTES, deadline, truncate=True)
                raise self._refused(exc.code, body, action, what) from None
            with response:
                body = _read(response, MAX_ANSWER_BYTES, deadline)
                return _Answer(response.status, body, _store_time(response.headers.get("Date")))
        except StorageError:
            raise
        except _TooLong:
            raise self._unavailable(f"{action} {what}", f"an answer of more than {MAX_ANSWER_BYTES} bytes") from None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise self._unavailable(f"{action} {what}", _cause(exc)) from None

    def _refused(self, status: int, body: bytes, action: str, what: str) -> StorageError:
        code = _error_code(body)
        if code == "NoSuchUpload":
            return BlobNotFound(f"object store: no incomplete multipart upload {what} any more", setting=ENDPOINT_URL)
        if status in (401, 403) and code != "NoSuchBucket":
            return StorageRefused(
                f"{ACCESS_KEY}: the object store at {self._where()} refused to {action} {what}"
                f" ({code or f'HTTP {status}'}); its credentials need {PERMISSIONS}", setting=ACCESS_KEY,
            )
        if status in (405, 501) or code == "NotImplemented":
            return StorageRefused(
                f"{ENDPOINT_URL}: the object store at {self._where()} cannot {action} {what}"
                f" ({code or f'HTTP {status}'}): it does not support it", setting=ENDPOINT_URL,
            )
        return classify_answer(status, body, action=action, what=what, settings=self.settings)

    def _unavailable(self, action: str, cause: str) -> StorageUnavailable:
        return StorageUnavailable(
            f"{ENDPOINT_URL}: the object store at {self._where()} could not {action} ({cause})",
            setting=ENDPOINT_URL,
        )

    def _where(self) -> str:
        return self.settings.endpoint_url or "AWS S3"

    def _upload(self, element: ElementTree.Element) -> IncompleteUpload | None:
        """One listed upload, or None for one we cannot judge (no start time, a key outside our
        prefix, an odd upload id): such an upload is never aborted."""
        key, upload_id = _text(element, "Key"), _text(element, "UploadId")
        initiated = _time(_text(element, "Initiated"))
        if (
            key is None or not key.startswith(self._prefix) or len(key) == len(self._prefix)
            or not upload_id or len(upload_id) > MAX_UPLOAD_ID or not upload_id.isprintable()
            or initiated is None
        ):
            return None
        return IncompleteUpload(key[len(self._prefix):], upload_id, initiated)


@dataclasses.dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes
    store_time: datetime.datetime


class _TooLong(Exception):
    pass


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx is an error answer: the signed headers go to the endpoint only."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _opener() -> urllib.request.OpenerDirector:
    # The default handlers otherwise: the environment's proxies, as obstore's client honours them.
    return urllib.request.build_opener(
        _NoRedirects(), urllib.request.HTTPSHandler(context=ssl.create_default_context())
    )


def _read(response: Any, limit: int, deadline: float, *, truncate: bool = False) -> bytes:
    """At most `limit` bytes of the body (more: _TooLong, or cut there with `truncate`), read by
    the deadline (each receive within the socket's timeout)."""
    chunks: list[bytes] = []
    total = 0
    while True:
        if time.monotonic() > deadline:
            raise socket.timeout("timed out")
        chunk = response.read1(READ_CHUNK)  # what one receive brought: read() would wait for all
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > limit:
            if truncate:
                chunks.append(chunk[: len(chunk) - (total - limit)])
                return b"".join(chunks)
            raise _TooLong()
        chunks.append(chunk)


def _xml(body: bytes, unavailable: Callable[[str, str], StorageUnavailable], what: str) -> ElementTree.Element:
    """The answer's XML, refused unless it is UTF-8 without a DTD: without one no entity can be
    declared, so nothing expands beyond what was read (the five predefined ones aside)."""
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise unavailable(f"read its {what}", "not UTF-8") from None
    if "<!DOCTYPE" in text or "<!ENTITY" in text:
        raise unavailable(f"read its {what}", "XML with a document type declaration, refused") from None
    try:
        return ElementTree.fromstring(text)
    except ElementTree.ParseError:
        raise unavailable(f"read its {what}", "not well-formed XML") from None


def _local(tag: Any) -> str:
    """An element's name without its namespace: S3 answers in its 2006-03-01 namespace, some
    stores in none."""
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def _children(element: ElementTree.Element, name: str) -> list[ElementTree.Element]:
    return [child for child in element if _local(child.tag) == name]


def _text(element: ElementTree.Element, name: str) -> str | None:
    for child in element:
        if _local(child.tag) == name:
            return (child.text or "").strip()
    return None


def _int(text: str | None) -> int:
    try:
        value = int(text or "0")
    except ValueError:
        return 0
    return value if 0 <= value < 2**63 else 0


def _time(text: str | None) -> datetime.datetime | None:
    """An S3 timestamp (ISO 8601, "2026-12-05T06:13:03.221Z"), None when it is not one."""
    if not text or len(text) > 40:
        return None
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=datetime.timezone.utc)


def _store_time(date: str | None) -> datetime.datetime:
    """The answer's Date header, or our clock when it has none (or an odd one)."""
    if date and len(date) <= 64:
        try:
            moment = email.utils.parsedate_to_datetime(date)
        except (TypeError, ValueError):
            moment = None
        if moment is not None and moment.tzinfo is not None:
            return moment
    return datetime.datetime.now(datetime.timezone.utc)


def _error_code(body: bytes) -> str | None:
    """The S3 error code of an error answer (`<Code>...</Code>`), without parsing it as XML."""
    text = body[:4096].decode("utf-8", "replace")
    start = text.find("<Code>")
    end = text.find("</Code>", start)
    if start < 0 or end < 0:
        return None
    code = text[start + len("<Code>"):end]
    return code if code.isalnum() and len(code) <= 64 else None


def _cause(exc: BaseException) -> str:
    """What went wrong, in a few words (never the request, which names the upload)."""
    if isinstance(exc, urllib.error.URLError):
        exc = exc.reason if isinstance(exc.reason, BaseException) else exc
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or type(exc).__name__}"
    if isinstance(exc, (http.client.HTTPException, ConnectionError)):
        return "connection closed mid-answer"
    if isinstance(exc, socket.gaierror):
        return "cannot resolve the endpoint's host"
    return type(exc).__name__
