"""`Client`: the Python face of an Arkvory installation (SPEC §10).

    with Client("http://balancer:8080", token) as client:
        result = client.download("builds", "app.tar.gz", asset="latest/app.tar.gz")
        artifact = client.upload("builds", "app.tar.gz", asset="latest/app.tar.gz")

Synchronous (one httpx.Client): simple for a CLI and fast enough with large chunks. Every call
retries by SPEC §6 within its RetryPolicy and raises a `arkvory.shared.client.errors.ClientError`
subclass (each with its CLI exit code) when it cannot succeed.
"""

from __future__ import annotations

import os
import pathlib
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from . import credentials
from . import retention
from .credentials import Session
from .download import ContentRoute, Download, DownloadResult, Progress, name_from_headers
from .errors import UsageError
from .retries import RetryPolicy
from .transport import Transport
from .upload import Upload, UploadedArtifact

MiB = 1024 * 1024


class Client:
    """Talks to one installation through one or several base URLs (a balancer, or backends).

    Content downloads may go to any of them; changes, lists, metadata and credentials go to the
    first one that serves the writer's routes (read gateways are recognised and skipped:
    shared/client/transport.py). The token is sent only in the `Authorization` header and never
    shown (not in `repr`, not in logs)."""

    def __init__(
        self,
        base_urls: str | Sequence[str],
        token: str | None,
        *,
        retry: RetryPolicy | None = None,
        timeout: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.retry = retry or RetryPolicy()
        self._transport = Transport(base_urls, token, retry=self.retry, timeout=timeout, sleep=sleep)
        self._authenticated = bool(token)

    @property
    def base_urls(self) -> list[str]:
        return list(self._transport.base_urls)

    def __repr__(self) -> str:
        token = "<hidden>" if self._authenticated else None
        return f"Client(base_urls={self.base_urls!r}, token={token!r}, retry={self.retry!r})"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._transport.close()

    # -- content --------------------------------------------------------------------------------

    def download(
        self,
        repo: str,
        dest: str | os.PathLike[str],
        *,
        artifact_id: str | None = None,
        asset: str | None = None,
        package: tuple[str, str, str] | None = None,
        progress: Progress | None = None,
        durable: bool = False,
    ) -> DownloadResult:
        """Download one artifact (by id, asset path or package coordinates) into `dest`.

        The bytes grow `dest.part` and are moved into place (an atomic rename) only once their
        SHA-256 matches; a `.part` left by an interrupted run is continued if the server still
        has its ETag. `dest`'s directory must exist (LocalIOError otherwise: none is created).
        `progress(done_bytes, total_bytes or None)` is called as bytes arrive.

        Like curl and wget, a download leaves writing the file back to the kernel: when this
        returns, `dest` holds the verified bytes for every reader, but a power cut soon after
        may lose them. `durable=True` waits until the file is on disk (fsync before the rename,
        then of the directory), which costs the disk's write time (~2.8 s per GiB on the
        project's test host)."""
        route = _content_route(repo, artifact_id, asset, package)
        metadata: Callable[[], str | None] | None = None
        if artifact_id is not None:
            metadata = lambda: self.stat(repo, artifact_id).get("sha256")  # noqa: E731
        return Download(
            self._transport, route, pathlib.Path(dest), progress=progress, metadata_sha256=metadata,
            durable=durable,
        ).run()

    def offered_name(
        self,
        repo: str,
        *,
        artifact_id: str | None = None,
        asset: str | None = None,
        package: tuple[str, str, str] | None = None,
    ) -> str | None:
        """The file name the server offers for this content (its `Content-Disposition`), as
        sent: make it safe before creating a file by it. None when it offers none. One HEAD of
        the content route, which every process serves, a read gateway too."""
        route = _content_route(repo, artifact_id, asset, package)
        response = self._transport.request(
            "HEAD", route.path, route.what, params=route.params, writer_only=False
        )
        return name_from_headers(response.headers)

    def upload(
        self,
        repo: str,
        path: str | os.PathLike[str],
        *,
        name: str | None = None,
        asset: str | None = None,
        media_type: str | None = None,
        part_size: int = 16 * MiB,
        progress: Progress | None = None,
    ) -> UploadedArtifact:
        """Upload a file as an artifact (resumable, in parts); returns the artifact's JSON.

        Safe to re-run: an interrupted upload resumes (`path.arkvory-upload` keeps its key),
        and a file already stored under this name with these bytes is not stored twice (the
        answer's `stored_already` is then True). With `asset`, that asset path is pointed at
        the artifact afterwards."""
        return Upload(
            self._transport, repo, pathlib.Path(path), name=name, asset=asset, media_type=media_type,
            part_size=part_size, progress=progress,
        ).run()

    # -- metadata -------------------------------------------------------------------------------

    def list_artifacts(self, repo: str, *, name: str | None = None, page_size: int = 1000) -> Iterator[dict[str, Any]]:
        """Every artifact of the repository, oldest first (pages followed as they are read)."""
        cursor: str | None = None
        while True:
            params = {"limit": str(page_size)}
            if name is not None:
                params["name"] = name
            if cursor:
                params["cursor"] = cursor
            page = self._transport.json(
                "GET", f"/api/v1/repositories/{_quote(repo)}/artifacts", f"list artifacts of {repo}", params=params
            )
            yield from page.get("items", [])
            cursor = page.get("nextCursor")
            if not cursor:
                return

    def stat(self, repo: str, artifact_id: str) -> dict[str, Any]:
        """One artifact's metadata: id, name, sha256, size, mediaType, createdAt."""
        return self._transport.json(
            "GET", f"/api/v1/repositories/{_quote(repo)}/artifacts/{_quote(artifact_id)}", f"artifact {artifact_id}"
        )

    def delete(self, repo: str, artifact_id: str) -> None:
        """Delete an artifact's metadata (409 → ConflictError while a package or asset uses it).
        One Idempotency-Key for every attempt, so a retry after a lost answer is not a 404."""
        self._transport.request(
            "DELETE", f"/api/v1/repositories/{_quote(repo)}/artifacts/{_quote(artifact_id)}",
            f"delete artifact {artifact_id}", headers={"Idempotency-Key": uuid.uuid4().hex},
        )

    # -- retention rules (issue 25) --------------------------------------------------------------

    def retention_rule(self, repo: str) -> dict[str, Any]:
        """The repository's retention rule (NotFoundError when it has none): keepNewest,
        keepYoungerThanSeconds, enabled, updatedAt, lastAppliedAt, deletedTotal."""
        return retention.show(self._transport, repo)

    def set_retention_rule(
        self, repo: str, *, keep_newest: int | None = None, keep_younger_than_s: int | None = None,
        enabled: bool = False,
    ) -> dict[str, Any]:
        """Replace the repository's rule: an artifact goes only when it is beyond the newest
        `keep_newest` and older than `keep_younger_than_s` (one limit alone keeps by that one),
        never while a package version or an asset points at it. Saved disabled unless
        `enabled`: see `retention_preview` first."""
        return retention.set_rule(
            self._transport, repo, keep_newest=keep_newest, keep_younger_than_s=keep_younger_than_s, enabled=enabled
        )

    def delete_retention_rule(self, repo: str) -> None:
        retention.delete(self._transport, repo)

    def retention_preview(
        self, repo: str, *, keep_newest: int | None = None, keep_younger_than_s: int | None = None,
        page_size: int = 1000,
    ) -> Iterator[dict[str, Any]]:
        """The dry run: the artifacts the next cleanup would delete, oldest first (pages
        followed as they are read), by the saved rule, or by the limits given."""
        return retention.preview(
            self._transport, repo, keep_newest=keep_newest, keep_younger_than_s=keep_younger_than_s,
            page_size=page_size,
        )

    # -- credentials (SPEC §5) -------------------------------------------------------------------

    def login(self, name: str, password: str, *, device_cookie: str | None = None) -> Session:
        """A session for the account (its token is for `create_token(session=...)`). Keep its
        `device_cookie` and pass it to the next login as the account: that login is then limited
        on its own, and never waits for a lockout that others' wrong passwords caused."""
        return credentials.login(self._transport, name, password, device_cookie)

    def logout(self, session: Session) -> None:
        credentials.logout(self._transport, session)

    def create_token(
        self,
        *,
        access: str,
        label: str = "",
        expires_in_seconds: int | None = None,
        password: str | None = None,
        session: Session | None = None,
    ) -> dict[str, Any]:
        """A new personal token, `access` "read" or "write"; the secret is in the answer's
        `token`, and only there. It expires at the latest with the credential making it (this
        client's token, or `session`) unless the account's `password` is sent with it."""
        return credentials.create_token(
            self._transport, access=access, label=label, expires_in_seconds=expires_in_seconds,
            password=password, session=session,
        )

    def change_password(self, old: str, new: str, *, session: Session | None = None) -> None:
        """Change the account's own password, as `session` (or this client's token): its other
        sessions end, its personal tokens stay."""
        credentials.change_password(self._transport, old, new, session)

    def list_accounts(self, *, page_size: int = 1000) -> list[dict[str, Any]]:
        """Every account, by name (an administrator's call)."""
        return credentials.list_accounts(self._transport, page_size)

    def account(self, name: str) -> dict[str, Any]:
        """One account (an administrator's call), with `holds`: what deleting it would end."""
        return credentials.show_account(self._transport, name)

    def reset_password(self, name: str, password: str) -> dict[str, Any]:
        """Set another account's password (an administrator's call): its sessions end, and it
        must set its own at its next sign-in."""
        return credentials.reset_password(self._transport, name, password)

    def delete_account(self, name: str) -> dict[str, Any]:
        """Delete an account (an administrator's call): its credentials end at once, the keys it
        made are suspended, its permissions go, its artifacts stay. What ended, counted."""
        return credentials.delete_account(self._transport, name)

    def list_tokens(self, *, page_size: int = 1000) -> list[dict[str, Any]]:
        """This account's personal tokens, without their secrets (every page followed)."""
        return credentials.list_tokens(self._transport, page_size)

    def revoke_token(self, token_id: str) -> None:
        credentials.revoke_token(self._transport, token_id)

    def list_keys(self, *, page_size: int = 1000) -> list[dict[str, Any]]:
        """Every managed service key, without secrets (an administrator's call); a key whose
        maker account was disabled has `suspendedAt` and is refused until adopted."""
        return credentials.list_keys(self._transport, page_size)

    def adopt_key(self, key_id: str, *, password: str | None = None) -> dict[str, Any]:
        """Make a suspended managed key this client's (an administrator's): it works again, and
        ends with this client's token unless the account's `password` is sent."""
        return credentials.adopt_key(self._transport, key_id, password)

    def revoke_key(self, key_id: str) -> None:
        credentials.revoke_key(self._transport, key_id)


def _content_route(
    repo: str, artifact_id: str | None, asset: str | None, package: tuple[str, str, str] | None
) -> ContentRoute:
    """The content route (SPEC §6) of exactly one of an artifact id, an asset path, a package."""
    chosen = [x for x in (artifact_id, asset, package) if x is not None]
    if len(chosen) != 1:
        raise UsageError("download: give exactly one of artifact_id, asset, package")
    base = f"/api/v1/repositories/{_quote(repo)}"
    if artifact_id is not None:
        return ContentRoute(f"{base}/artifacts/{_quote(artifact_id)}/content", {}, f"download of artifact {artifact_id}")
    if asset is not None:
        return ContentRoute(f"{base}/asset/content", {"path": asset}, f"download of asset {asset}")
    assert package is not None
    if len(package) != 3 or not all(isinstance(p, str) and p for p in package):
        raise UsageError("download: package must be (group, name, version)")
    group, name, version = package
    return ContentRoute(
        f"{base}/packages/content", {"group": group, "name": name, "version": version},
        f"download of package {group}/{name}@{version}",
    )


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")
