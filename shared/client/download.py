"""Downloads that survive any cut (SPEC §6, §10): resume with Range + If-Range, never splice.

The bytes grow `NAME.part` (shared/client/partfile.py). After a cut, a 5xx or a `503 busy`, the
next request asks for `bytes=N-` with `If-Range: <strong ETag>`, on the next base URL; it is
accepted only as a `206` whose `Content-Range` starts at N, whose total is the size we know and
whose ETag is ours. A `200` means the server sends the whole representation again (it ignored the
range, or the ETag changed because an asset was re-pointed): the .part is emptied and filled
from byte 0. Anything else that does not fit starts over too. So the file is always the bytes of
one ETag (a download that has to start over more than `max_attempts` times gives up). At the
end the SHA-256 is checked against `Repr-Digest` (or the artifact's metadata) and the file is
renamed into place (fsynced first, and its directory after, only when `durable`: see
shared/client/partfile.py); a mismatch removes the .part and raises IntegrityError.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import pathlib
import re
import urllib.parse
from collections.abc import Callable, Mapping

from .errors import IntegrityError, NetworkError
from .partfile import BATCH, PartFile
from .rawget import NETWORK_ERRORS, Headers, RawResponse, open_get
from .retries import Retryable
from .transport import Transport

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
# One `; name=value` parameter of Content-Disposition: a token, or a quoted string.
_DISPOSITION_PARAM = re.compile(r';\s*([!#$%&\'*+.^_`|~0-9A-Za-z-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;\s]*)')

Progress = Callable[[int, "int | None"], None]


@dataclasses.dataclass(frozen=True)
class DownloadResult:
    """What a download did: `resumed_bytes` were not sent again thanks to Range requests,
    `restarts` counts the times it started over from byte 0, `attempts` the HTTP requests,
    `received_bytes` the payload bytes received over all of them; `continued_bytes` of those
    not sent again were in a `.part` left by an earlier run (0 when it started afresh)."""

    path: pathlib.Path
    size: int
    sha256: str
    etag: str | None
    resumed_bytes: int
    restarts: int
    attempts: int
    received_bytes: int = 0
    continued_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class ContentRoute:
    """One of the three content routes of SPEC §6 and its query parameters."""

    path: str
    params: Mapping[str, str]
    what: str


def sha256_from_headers(headers: Headers) -> str | None:
    """The hex SHA-256 in `Repr-Digest: sha-256=:B64:` (RFC 9530), else in `Digest: sha-256=B64`."""
    for name, pattern in (("repr-digest", r"sha-256=:([A-Za-z0-9+/=]+):"), ("digest", r"sha-256=([A-Za-z0-9+/=]+)")):
        value = headers.get(name)
        if value is None:
            continue
        found = re.search(pattern, value, re.IGNORECASE)
        if found:
            try:
                raw = base64.b64decode(found.group(1), validate=True)
            except (binascii.Error, ValueError):
                continue
            if len(raw) == 32:
                return raw.hex()
    return None


def name_from_headers(headers: Headers) -> str | None:
    """The file name of `Content-Disposition` (RFC 6266): `filename*` (RFC 8187, UTF-8) before
    `filename`; None without one. Not yet safe as a local file name."""
    params: dict[str, str] = {}
    for key, raw in _DISPOSITION_PARAM.findall(headers.get("content-disposition", "")):
        params.setdefault(key.lower(), raw)
    charset, _, rest = params.get("filename*", "").partition("'")
    encoded = rest.partition("'")[2]
    if charset.lower() == "utf-8" and encoded:
        try:
            return urllib.parse.unquote(encoded, errors="strict")
        except UnicodeDecodeError:
            pass  # then the plain filename, if any
    plain = params.get("filename", "")
    if plain.startswith('"'):
        plain = re.sub(r"\\(.)", r"\1", plain[1:-1])
    return plain or None


class _StartOver(Exception):
    """The answer does not continue our bytes: empty the .part and ask for everything."""


class Download:
    """One download into `dest`; `run()` returns its DownloadResult or raises a ClientError."""

    def __init__(
        self,
        transport: Transport,
        route: ContentRoute,
        dest: pathlib.Path,
        *,
        progress: Progress | None = None,
        metadata_sha256: Callable[[], str | None] | None = None,
        durable: bool = False,
    ) -> None:
        self.transport = transport
        self.route = route
        self.part = PartFile(dest, durable=durable)
        self.progress = progress
        self.metadata_sha256 = metadata_sha256
        self.total: int | None = None
        self.sha256: str | None = None  # what the server says the whole file hashes to
        self.resumed_bytes = 0
        self.restarts = 0
        self.attempts = 0
        self.received_bytes = 0
        # What the first answer kept of a .part an earlier run left: None until it came.
        self.continued_bytes: int | None = None

    def run(self) -> DownloadResult:
        part = self.part
        part.open()
        try:
            # Each sequence of retries ends when an answer moved the file forward; a transfer cut
            # now and then is never given up while it progresses (shared/client/retries.py).
            while not self._sequence():
                self.transport.rotate()  # cut after some bytes: the backend may be gone
                if self.restarts > self.transport.retry.max_attempts:
                    raise NetworkError(
                        f"{self.route.what}: started over {self.restarts} times; the server keeps"
                        " changing what it sends"
                    )
            return self._verified()
        except BaseException:
            part.abandon()
            raise
        finally:
            part.close()

    def _sequence(self) -> bool:
        """Attempts until one makes progress: True when the file is complete."""
        try:
            for attempt in self.transport.attempts(self.route.what):
                with attempt:
                    return self._one_answer()
        except Retryable as exc:
            raise exc.error from None
        raise AssertionError("unreachable")

    def _one_answer(self) -> bool:
        part = self.part
        offset = part.length
        resuming = offset > 0 and _strong(part.etag)
        if offset > 0 and not resuming:
            self._start_over(None)
            offset = 0
        headers = {"Accept-Encoding": "identity"}
        if resuming:
            assert part.etag is not None
            headers["Range"] = f"bytes={offset}-"
            headers["If-Range"] = part.etag
        transport = self.transport
        self.attempts += 1
        try:
            response = open_get(
                transport.url(self.route.path), self.route.params, transport.headers(headers), timeout=transport.timeout
            )
        except NETWORK_ERRORS as exc:
            raise transport.network_failure(exc, self.route.what) from exc
        transport.note_answer()
        try:
            try:
                self._accept(response, offset if resuming else 0)
            except _StartOver as exc:
                self._start_over(None)
                # Straight away: nothing failed, the next answer is a plain whole one.
                raise Retryable(NetworkError(f"{self.route.what}: {exc}"), 0.0, rotate=False) from None
            return self._receive(response)
        finally:
            response.close()

    def _accept(self, response: RawResponse, offset: int) -> None:
        """Decide what this answer's body is: the whole file, or our bytes from `offset`."""
        status = response.status_code
        if status not in (200, 206):
            if status == 416:  # past the end: what we have is not a prefix we can trust
                raise _StartOver("the server cannot continue from our offset (416)")
            raise self.transport.refusal(response.as_httpx(), self.route.what)
        etag = response.headers.get("etag")
        sha256 = sha256_from_headers(response.headers)
        if status == 200:
            length = _int(response.headers.get("content-length"))
            if self.part.length or self.part.etag != etag:
                if self.part.length:
                    self.restarts += 1
                self._start_over(etag)
            self.total, self.sha256 = length, sha256
            if self.continued_bytes is None:
                self.continued_bytes = 0
            return
        found = _CONTENT_RANGE.fullmatch(response.headers.get("content-range", "").strip())
        if not found or etag != self.part.etag:
            raise _StartOver(f"a 206 that does not continue our bytes (ETag {etag}, {found and found.group(0)})")
        start, end, total = (int(g) for g in found.groups())
        if start != offset or end != total - 1 or (self.total is not None and total != self.total):
            raise _StartOver(f"a 206 for bytes {start}-{end}/{total}, we asked for {offset}- of {self.total}")
        if self.sha256 is not None and sha256 is not None and sha256 != self.sha256:
            raise _StartOver("the server's digest changed under the same ETag")
        self.total = total
        self.sha256 = self.sha256 or sha256
        self.resumed_bytes += offset
        if self.continued_bytes is None:
            self.continued_bytes = offset

    def _receive(self, response: RawResponse) -> bool:
        """Stream the body into the .part; True when complete, False when cut after progress."""
        part, progress, total = self.part, self.progress, self.total
        received = 0
        cut: BaseException | None = None
        if progress is not None:
            progress(part.length, total)
        while True:
            # Not the last batch's buffer: the hashing thread may still read it.
            batch = part.batch_buffer()
            filled = 0
            try:
                while filled < BATCH:
                    count = response.readinto(batch[filled:])
                    if not count:
                        break
                    filled += count
            except NETWORK_ERRORS as exc:
                cut = exc  # what arrived before the cut is good (TCP delivers in order): keep it
            if filled:
                part.write(batch[:filled], batch)
                received += filled
                if progress is not None:
                    progress(part.length, total)
            else:
                part.unused(batch)
            if cut is not None or filled < BATCH:
                break
        self.received_bytes += received
        if total is None or part.length < total:
            if total is None and cut is None:
                self.total = part.length  # no length given: the end of the body is the end
                return True
            if received:
                return False
            failure = cut or NetworkError("the body ended early")
            raise self.transport.network_failure(failure, self.route.what)
        if part.length > total:
            self._start_over(None)
            raise Retryable(NetworkError(f"{self.route.what}: the body was longer than {total} bytes"), 0.0)
        return True

    def _start_over(self, etag: str | None) -> None:
        self.part.start_over(etag)
        self.total = None
        self.sha256 = None

    def _verified(self) -> DownloadResult:
        part = self.part
        actual = part.hexdigest()
        expected = self.sha256
        if expected is None and self.metadata_sha256 is not None:
            expected = self.metadata_sha256()
        if expected is None:
            part.discard()
            raise IntegrityError(f"{self.route.what}: the server sent no SHA-256 to check the file against")
        if self.total is not None and part.length != self.total:
            part.discard()
            raise IntegrityError(f"{self.route.what}: received {part.length} bytes, expected {self.total}")
        if actual != expected:
            part.discard()
            raise IntegrityError(f"{self.route.what}: the file's SHA-256 is {actual}, the server's {expected}")
        etag, size = part.etag, part.length
        part.finish()
        return DownloadResult(
            path=part.dest,
            size=size,
            sha256=actual,
            etag=etag,
            resumed_bytes=self.resumed_bytes,
            restarts=self.restarts,
            attempts=self.attempts,
            received_bytes=self.received_bytes,
            continued_bytes=self.continued_bytes or 0,
        )


def _strong(etag: str | None) -> bool:
    return bool(etag) and not etag.startswith("W/")  # If-Range needs a strong validator


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None
