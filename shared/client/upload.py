"""Uploads that are safe to retry and to re-run (SPEC §6, §10).

A file goes up through the resumable session API in parts (16 MiB by default), one at a time
while the next one is read and hashed in a thread (a principal has one upload place on a writer
with default settings, ARKVORY_MAX_UPLOADS_PER_PRINCIPAL: a second body at once would only be
refused), each with its `X-Content-SHA256` and its own retry sequence: a byte flipped in flight
is a `422 digest_mismatch` for that part alone, which is sent again. The whole logical upload has
one `Idempotency-Key`, written *before* the session is created to `NAME.arkvory-upload` beside
the file (JSON: key, session id, size, mtime_ns, SHA-256 when known, and the request's
parameters).
A re-run of the same upload finds it and resumes the same session, sending only the parts the
server lacks; a changed file or other parameters start a new upload with a new key. The key file
is removed once the artifact exists (and the asset points at it, when asked).

Re-running an upload that already succeeded makes no second artifact: an artifact of the same
name and SHA-256 in the repository is taken as the result. Only when one of the same name and
size exists is the file hashed before anything is sent (and the SHA-256 then declared to the
session, so the writer refuses anything else). That answer is given only to a principal that
may write: the client lists its upload sessions in the repository first, which needs write
permission (a reader gets the writer's 403 there, an AuthError). Listing artifacts needs only
read access, so without that step a reader would be told its put worked. No session is opened
for it: a session reserves the file's size on the writer's disk, within the principal's
ARKVORY_MAX_RESERVED_BYTES_PER_PRINCIPAL.

Why the artifact is the file without a whole-file hash of our own on the common path: every
part's SHA-256 is computed here from the bytes read for it and checked by the writer, which
hashes the artifact from exactly those parts; and a file whose size or mtime changed during
the upload is not completed. Only parts stored by an *earlier* run were read from a file we
cannot vouch for (same size and mtime, but bytes we did not hash now): then the whole file is
hashed from the parts as they go (shared/client/wholehash.py), compared with the artifact's
SHA-256, and an artifact of other bytes is deleted again (IntegrityError).
"""

from __future__ import annotations

import collections.abc
import concurrent.futures
import dataclasses
import hashlib
import json
import math
import os
import pathlib
import stat
import threading
import urllib.parse
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

from .errors import (
    AuthError,
    ClientError,
    ConflictError,
    IntegrityError,
    LocalIOError,
    NotFoundError,
    UsageError,
)
from .retries import Retryable
from .transport import Transport
from .wholehash import WholeFileHash

MiB = 1024 * 1024
MIN_PART, MAX_PART, MAX_PARTS = 1 * MiB, 64 * MiB, 10_000  # the server's bounds (writer/uploads/sessions.py)
STATE_SUFFIX = ".arkvory-upload"
STATE_VERSION = 1
HASH_READ = 8 * MiB

Progress = collections.abc.Callable[[int, "int | None"], None]


def state_path(path: pathlib.Path) -> pathlib.Path:
    return path.with_name(path.name + STATE_SUFFIX)


def effective_part_size(size: int, wanted: int) -> int:
    """`wanted`, raised (to whole MiB) so that there are at most MAX_PARTS parts."""
    if not MIN_PART <= wanted <= MAX_PART:
        raise UsageError(f"part_size: expected {MIN_PART}..{MAX_PART} bytes, got {wanted}")
    smallest = math.ceil(math.ceil(size / MAX_PARTS) / MiB) * MiB
    if smallest > MAX_PART:
        raise UsageError(f"{size} bytes is more than a resumable upload can hold ({MAX_PARTS} × 64 MiB)")
    return max(wanted, smallest)


@dataclasses.dataclass
class UploadState:
    """What `NAME.arkvory-upload` holds: the key of one logical upload and what it was for."""

    key: str
    session: str | None
    size: int
    mtime_ns: int
    sha256: str
    repo: str
    name: str
    media_type: str | None
    part_size: int

    def same_upload(self, other: UploadState) -> bool:
        """The same file (size, mtime, and SHA-256 where both know it) and the same request."""
        mine, theirs = dataclasses.asdict(self), dataclasses.asdict(other)
        if mine["sha256"] and theirs["sha256"] and mine["sha256"] != theirs["sha256"]:
            return False
        return all(mine[f] == theirs[f] for f in mine if f not in ("key", "session", "sha256"))

    @classmethod
    def load(cls, path: pathlib.Path) -> UploadState | None:
        """The saved state, or None if there is none or it is unreadable (then we start anew)."""
        try:
            raw = json.loads(path.read_text())
            if raw.pop("version", None) != STATE_VERSION:
                return None
            return cls(**raw)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError):
            return None

    def save(self, path: pathlib.Path) -> None:
        """Written whole to a temporary name and renamed, so a kill never leaves half a file."""
        temporary = path.with_name(path.name + f".{os.getpid()}.tmp")
        try:
            with open(temporary, "w") as file:
                json.dump({"version": STATE_VERSION, **dataclasses.asdict(self)}, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise LocalIOError(f"cannot write {path} (the key that makes a re-run resume): {exc.strerror or exc}") from None


class UploadedArtifact(dict[str, Any]):
    """The artifact's JSON as the server sent it (a plain dict to read), and whether the upload
    found it `stored_already` (the same name and SHA-256 in the repository: nothing was sent)."""

    def __init__(self, artifact: dict[str, Any], *, stored_already: bool) -> None:
        super().__init__(artifact)
        self.stored_already = stored_already


@dataclasses.dataclass(frozen=True)
class FileDigest:
    size: int
    mtime_ns: int
    sha256: str


def file_digest(path: pathlib.Path) -> FileDigest:
    """The file's SHA-256, size and mtime, refusing a file that changes while it is read.

    Needed before the upload starts: the session declares it (the writer then refuses to
    publish anything else) and it tells a re-run whether an artifact with these bytes exists.
    Each part's own hash is computed later, in the thread that sends it, while the other one
    waits on the network."""
    try:
        with open(path, "rb") as file:
            before = os.fstat(file.fileno())
            whole = hashlib.sha256()
            while data := file.read(HASH_READ):
                whole.update(data)
            after = os.fstat(file.fileno())
    except OSError as exc:
        raise LocalIOError(f"cannot read {path}: {exc.strerror or exc}") from None
    if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns):
        raise LocalIOError(f"{path} changed while it was being read; try again when it is complete")
    return FileDigest(after.st_size, after.st_mtime_ns, whole.hexdigest())


class Upload:
    """One logical upload of `path` into `repo`; `run()` returns the artifact's JSON."""

    def __init__(
        self,
        transport: Transport,
        repo: str,
        path: pathlib.Path,
        *,
        name: str | None = None,
        asset: str | None = None,
        media_type: str | None = None,
        part_size: int = 16 * MiB,
        progress: Progress | None = None,
    ) -> None:
        self.transport = transport
        self.repo = repo
        self.path = path
        self.name = name or path.name
        self.asset = asset
        self.media_type = media_type
        self.wanted_part_size = part_size
        self.progress = progress
        self.state_file = state_path(path)
        self.base = f"/api/v1/repositories/{_quote(repo)}"
        # What an error says was asked: "upload of app.tar.gz to bulids: no repository 'bulids'".
        self.what = f"upload of {path.name} to {repo}"
        self._progress_lock = threading.Lock()
        self._done = 0
        self._size: int | None = None
        self._sent_here: set[int] = set()  # parts this run sent and the server acknowledged

    def run(self) -> UploadedArtifact:
        try:
            before = self.path.stat()
        except OSError as exc:
            raise LocalIOError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        if not stat.S_ISREG(before.st_mode):
            raise LocalIOError(f"cannot read {self.path}: not a regular file")
        self._size = size = before.st_size
        part_size = effective_part_size(size, self.wanted_part_size)
        known_sha256 = None
        done_before: dict[str, Any] | None = None
        # Only an artifact of this name and size can be this upload done before: hash the file
        # first then (to compare); otherwise its hash is computed while the parts go up.
        candidates = [a for a in self._artifacts_named() if a.get("size") == size]
        if candidates:
            known_sha256 = file_digest(self.path).sha256
            done_before = next((a for a in candidates if a.get("sha256") == known_sha256), None)
        wanted = UploadState(
            key=uuid.uuid4().hex, session=None, size=size, mtime_ns=before.st_mtime_ns,
            sha256=known_sha256, repo=self.repo, name=self.name, media_type=self.media_type,
            part_size=part_size,
        )
        saved = UploadState.load(self.state_file)
        state = saved if saved is not None and saved.same_upload(wanted) else wanted
        if done_before is not None:
            return self._stored_already(done_before, state if state is saved else None)
        if state is wanted:
            state.save(self.state_file)
        session = self._start_session(state)
        artifact, sha256 = self._through_session(state, session)
        expected = sha256 or state.sha256
        if (expected is not None and artifact["sha256"] != expected) or artifact["size"] != size:
            # Parts sent by an earlier run from other bytes under the same size and mtime: the
            # artifact is not this file. Take it back and start anew next time.
            self.state_file.unlink(missing_ok=True)
            self._delete_quietly(artifact)
            raise IntegrityError(
                f"upload of {self.path}: the server assembled sha256 {artifact['sha256']} ({artifact['size']} bytes),"
                f" the file has {expected} ({size} bytes); the artifact was deleted, run the upload again"
            )
        self._point_asset(artifact, state.key)
        self.state_file.unlink(missing_ok=True)
        return UploadedArtifact(artifact, stored_already=False)

    def _stored_already(self, artifact: dict[str, Any], saved: UploadState | None) -> UploadedArtifact:
        """The file is in the repository already: that artifact is the answer, but only for a
        principal that may write here, and without opening a session (which would reserve the
        file's size on the writer's disk just to be deleted). Listing this repository's upload
        sessions is the writer's own check: a reader gets its 403 (AuthError)."""
        self.transport.json("GET", f"{self.base}/uploads", self.what)
        if saved is not None and saved.session is not None:
            # An earlier run of this upload left a session: free what it reserves (a completed
            # one is refused and stays, which is right: it replays its artifact).
            self._delete_session_quietly({"id": saved.session})
        self._point_asset(artifact, saved.key if saved is not None else uuid.uuid4().hex)
        self.state_file.unlink(missing_ok=True)
        return UploadedArtifact(artifact, stored_already=True)

    # -- the session --------------------------------------------------------------------------

    def _start_session(self, state: UploadState) -> dict[str, Any]:
        """The upload's session: created, or the one the key already names (resumed)."""
        try:
            session = self._open_session(state)
            if session is None:  # the saved session expired or was removed: a new key, a new one
                state.key, state.session = uuid.uuid4().hex, None
                state.save(self.state_file)
                session = self._open_session(state)
                if session is None:
                    raise NotFoundError(f"upload of {self.path}: the new upload session vanished at once")
        except (AuthError, NotFoundError, UsageError):
            # Refused for good (no right, no repository): a key file naming no session has
            # nothing for a re-run to resume.
            if state.session is None:
                self.state_file.unlink(missing_ok=True)
            raise
        return session

    def _delete_session_quietly(self, session: dict[str, Any]) -> None:
        """A session this upload no longer needs: free its space now (if this fails, the
        writer's expiry sweep frees it later)."""
        try:
            self.transport.request(
                "DELETE", f"{self.base}/uploads/{session['id']}", "delete the unneeded upload session"
            )
        except ClientError:
            pass

    def _through_session(self, state: UploadState, session: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """(the artifact, the file's SHA-256 as read while sending)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as exc:
            raise LocalIOError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        try:
            sha256: str | None = None
            for _ in range(3):
                if session["status"] != "open":  # completed by an earlier run: nothing to send
                    session = {**session, "receivedParts": list(range(session["partCount"]))}
                sha256 = self._send_missing(fd, session) or sha256
                self._check_unchanged(state)
                try:
                    return self._complete(session), sha256
                except ConflictError:
                    # Parts missing (one lost with a restarted writer) or still being received.
                    session = self._session(session["id"])
                    if session is None:
                        raise
            raise ConflictError(f"upload of {self.path}: the server keeps refusing to complete the upload")
        finally:
            os.close(fd)

    def _check_unchanged(self, state: UploadState) -> None:
        """A file changed during the upload is not published (its parts may mix two versions)."""
        try:
            now = self.path.stat()
        except OSError as exc:
            raise LocalIOError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        if (now.st_size, now.st_mtime_ns) != (state.size, state.mtime_ns):
            self.state_file.unlink(missing_ok=True)
            raise LocalIOError(f"{self.path} changed during the upload; run it again when the file is complete")

    def _open_session(self, state: UploadState) -> dict[str, Any] | None:
        """Create the session with the upload's key (a repeat replays the same one), then read
        its current parts; None when the key's session is gone."""
        descriptor: dict[str, Any] = {"name": state.name, "size": state.size, "partSize": state.part_size}
        if state.sha256:
            descriptor["sha256"] = state.sha256  # then the writer refuses to publish other bytes
        if state.media_type:
            descriptor["mediaType"] = state.media_type
        response = self.transport.request(
            "POST", f"{self.base}/uploads", self.what,
            json=descriptor, headers={"Idempotency-Key": state.key},
        )
        created = _upload_session(_json(response, "start upload"), "start upload", response.status_code)
        if state.session != created["id"]:
            state.session = created["id"]
            state.save(self.state_file)
        if response.headers.get("idempotent-replayed") != "true":
            return created  # fresh: no part received yet
        return self._session(created["id"])

    def _session(self, session_id: str) -> dict[str, Any] | None:
        try:
            session = self.transport.json("GET", f"{self.base}/uploads/{session_id}", "read upload session")
        except NotFoundError:
            return None
        return _upload_session(session, "read upload session")

    # -- parts --------------------------------------------------------------------------------

    def _send_missing(self, fd: int, session: dict[str, Any]) -> str | None:
        """Send the parts the session lacks in order, one at a time, the next one read and
        hashed meanwhile. Returns the whole file's SHA-256 when the session holds parts of an
        earlier run (else None: see the module docstring)."""
        size, part_size = session["size"], session["partSize"]
        received = set(session["receivedParts"])
        missing = [i for i in range(session["partCount"]) if i not in received]
        whole = _NoWholeHash()
        if received - self._sent_here:
            whole = WholeFileHash(fd, size, part_size, set(missing), str(self.path))
        try:
            self._done = sum(_part_length(size, part_size, i) for i in received)
            self._report()
            with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="arkvory-put-read") as reader:
                upcoming = reader.submit(self._read_part, fd, session, missing[0], whole) if missing else None
                try:
                    for position, index in enumerate(missing):
                        assert upcoming is not None
                        data, part_sha256 = upcoming.result()
                        following = missing[position + 1] if position + 1 < len(missing) else None
                        upcoming = None if following is None else reader.submit(
                            self._read_part, fd, session, following, whole
                        )
                        self._send_part(session, index, data, part_sha256)
                except BaseException:
                    if upcoming is not None:
                        upcoming.cancel()
                    raise
        except BaseException:
            whole.abandon()
            raise
        return whole.hexdigest()

    def _read_part(
        self, fd: int, session: dict[str, Any], index: int, whole: WholeFileHash | _NoWholeHash
    ) -> tuple[bytes, str]:
        """In the reading thread: the part's bytes and their SHA-256."""
        size, part_size = session["size"], session["partSize"]
        length = _part_length(size, part_size, index)
        try:
            data = os.pread(fd, length, index * part_size)
        except OSError as exc:
            raise LocalIOError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        if len(data) != length:
            raise LocalIOError(f"{self.path} became shorter during the upload")
        whole.offer(index, data)
        return data, hashlib.sha256(data).hexdigest()

    def _send_part(self, session: dict[str, Any], index: int, data: bytes, part_sha256: str) -> None:
        length = len(data)
        what = f"upload part {index} of {self.path.name}"
        path = f"{self.base}/uploads/{session['id']}/parts/{index}"
        try:
            for attempt in self.transport.attempts(what):
                with attempt:
                    response = self.transport.send(
                        "PUT", path, what, content=data,
                        headers={"X-Content-SHA256": part_sha256, "Content-Type": "application/octet-stream"},
                    )
                    if not response.is_success:
                        self._part_refused(response, session["id"], index, what)
        except Retryable as exc:
            raise exc.error from None
        with self._progress_lock:
            self._sent_here.add(index)
            self._done += length
            self._report()

    def _part_refused(self, response: httpx.Response, session_id: str, index: int, what: str) -> None:
        """Raise what a refused part means: retry it, or give up."""
        refusal = self.transport.refusal(response, what)
        if isinstance(refusal, IntegrityError):
            # 422 digest_mismatch: the bytes were damaged on the way; nothing was kept.
            raise Retryable(refusal, None, rotate=False)
        if isinstance(refusal, ConflictError):
            # 409: the part is recorded already (then it is done: complete checks the whole
            # SHA-256), or a cut copy of it is still being received (then wait and resend).
            session = self._session(session_id)
            if session is not None and index in session["receivedParts"]:
                return
            raise Retryable(refusal, None, rotate=False)
        raise refusal

    def _report(self) -> None:
        if self.progress is not None:
            self.progress(self._done, self._size)

    # -- complete and asset -------------------------------------------------------------------

    def _complete(self, session: dict[str, Any]) -> dict[str, Any]:
        return self.transport.json(
            "POST", f"{self.base}/uploads/{session['id']}/complete", f"complete upload of {self.path.name}"
        )

    def _artifacts_named(self) -> list[dict[str, Any]]:
        """This repository's artifacts of this name (and media type, when one is asked for)."""
        found, cursor = [], None
        while True:
            params = {"name": self.name, "limit": "1000", **({"cursor": cursor} if cursor else {})}
            page = self.transport.json("GET", f"{self.base}/artifacts", self.what, params=params)
            found += [
                item for item in page.get("items", [])
                if self.media_type is None or item.get("mediaType") == self.media_type
            ]
            cursor = page.get("nextCursor")
            if not cursor:
                return found

    def _delete_quietly(self, artifact: dict[str, Any]) -> None:
        try:
            self.transport.request(
                "DELETE", f"{self.base}/artifacts/{artifact['id']}", "delete the mismatched artifact",
                headers={"Idempotency-Key": uuid.uuid4().hex},
            )
        except ClientError:
            pass  # the IntegrityError that follows says what happened

    def _point_asset(self, artifact: dict[str, Any], key: str) -> None:
        if self.asset is None:
            return
        self.transport.request(
            "PUT", f"{self.base}/assets", f"point asset {self.asset}",
            params={"path": self.asset}, json={"artifactId": artifact["id"]},
            headers={"Idempotency-Key": f"{key}-asset"},
        )


class _NoWholeHash:
    """Stands in for WholeFileHash when every part goes up in this run (see the module doc)."""

    def offer(self, index: int, data: bytes) -> None:
        pass

    def abandon(self) -> None:
        pass

    def hexdigest(self) -> None:
        return None


def _part_length(size: int, part_size: int, index: int) -> int:
    return min(size, (index + 1) * part_size) - index * part_size


def _json(response: httpx.Response, what: str) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        raise ClientError(f"{what}: the server's answer is not JSON", status=response.status_code) from None
    if not isinstance(body, dict):
        raise ClientError(f"{what}: unexpected answer", status=response.status_code)
    return body


_SESSION_FIELDS = {"id": str, "status": str, "size": int, "partSize": int, "partCount": int, "receivedParts": list}


def _upload_session(body: Any, what: str, status: int | None = None) -> dict[str, Any]:
    """An upload session as the server describes it, or a ClientError: a URL that is not an
    Arkvory writer (or a port now taken by another program) may answer JSON of another shape."""
    if not isinstance(body, dict):
        raise ClientError(f"{what}: unexpected answer (no upload session)", status=status)
    for field, kind in _SESSION_FIELDS.items():
        if not isinstance(body.get(field), kind) or isinstance(body.get(field), bool):
            raise ClientError(f"{what}: unexpected answer (no upload session: {field!r} missing or wrong)", status=status)
    if not all(isinstance(index, int) for index in body["receivedParts"]):
        raise ClientError(f"{what}: unexpected answer (no upload session: 'receivedParts' wrong)", status=status)
    return body


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")
