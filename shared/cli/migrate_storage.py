"""`arkvory admin migrate-storage --to URL` (SPEC §11): copy every blob from the storage the
database records to another (`file:` ↔ `s3://BUCKET[/PREFIX]`), verify each copy, and switch the
recorded location in one transaction once all are there.

- **Offline.** It takes the writer, worker and maintenance locks exclusively, as `arkvory admin gc`
  does (writer/worker/offline.py), so it refuses while any writer, gateway or worker runs,
  naming each (a slot's lease by slot, pid and host), and none can start until it ends: no
  upload, cleanup or verify changes a blob under it.
- **What it copies**: every blob the database references (`arkvory_blobs`), by digest. A copy is
  hashed on its way (size and SHA-256 against the digest) before it becomes visible at the
  target: a directory gets a temp file renamed into place, an object store a multipart upload
  that carries the digest (and is read back by HEAD). A blob missing or corrupt at the source is
  reported, and then nothing is switched (exit 1): verify and repair first.
- **Resumable.** A blob already at the target is kept when it proves itself (an object: its
  size and recorded SHA-256 by HEAD; a file: re-hashed), so a run that was interrupted, or cut
  by a store, continues where it stopped when run again.
- **Identity.** The target gets this installation's storage id (an object `PREFIX/arkvory-storage
  -id`, or the directory's id file); a target holding another id belongs to another
  installation and is refused. The id stays the same: only the location changes.
- **The old copy** is left in place (the output says how to remove it once the processes run on
  the new storage).

Settings: ARKVORY_DATABASE_URL, ARKVORY_DATA_DIR (the writer's: the `file:` side, and the temp
files of a copy from an object store), and for the `s3://` side ARKVORY_S3_ENDPOINT_URL,
ARKVORY_S3_REGION and the AWS credentials. ARKVORY_STORAGE_URL is not read: the source is what
the database records, the target is `--to`.

Exit statuses: 0 switched (or already there); 1 some blobs could not be copied (listed; nothing
switched); 2 usage or settings; 69 the database or a store did not answer (run it again: it
continues); 75 refused because a server is up; 78 a storage is another installation's.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import os
import pathlib
import sys
import time
import uuid
from collections.abc import Mapping
from typing import Any, TextIO

EXIT_OK, EXIT_INCOMPLETE, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_REFUSED, EXIT_CONFIG = 0, 1, 2, 69, 75, 78
APPLICATION_NAME = "arkvory-admin-migrate-storage"
PROGRESS_EVERY_S = 0.5
HASH_CHUNK = 1024 * 1024
COPY_CHUNK = 8 * 1024 * 1024


def register(commands: argparse._SubParsersAction, admin: argparse._SubParsersAction) -> None:
    from . import DEFAULT_DEV_DIR as DEFAULT_DIR

    migrate = admin.add_parser(
        "migrate-storage",
        help="copy every blob to another storage (file: or s3://BUCKET[/PREFIX]), verified, and switch"
        " to it; resumable; refuses while any server is up (exit 75)",
    )
    migrate.add_argument("--to", required=True, metavar="URL", help="file: or s3://BUCKET[/PREFIX]")
    migrate.add_argument(
        "--dev", nargs="?", const=DEFAULT_DIR, metavar="DIR",
        help=f"use the database and directory of the stopped arkvory dev in DIR (default {DEFAULT_DIR}),"
        " starting its PostgreSQL (and SeaweedFS) for the command's length",
    )
    migrate.set_defaults(func=_command)


def _command(args: argparse.Namespace) -> int:
    from arkvory.shared.errors import StartupError
    from arkvory.shared.settings import STORAGE_VARIABLES, Settings, SettingsError, format_problems

    from .dev import offline_tool_environment

    try:
        # A stopped dev's SeaweedFS runs when either side is on it.
        with offline_tool_environment(args.dev, object_store=args.to.startswith("s3:")) as environ:
            # Both sides are named below; the settings of the process's one storage are not read.
            base = {k: v for k, v in environ.items() if k not in STORAGE_VARIABLES}
            try:
                settings = Settings.from_env(base)
                from arkvory.shared.settings import object_store_for

                object_store_for(environ, args.to)  # a bad --to or S3 setting, before any connection
            except SettingsError as exc:
                print(format_problems(exc), file=sys.stderr)
                return EXIT_USAGE
            return asyncio.run(migrate_storage(settings, environ, args.to, dev_dir=args.dev))
    except StartupError as exc:  # no dev state, or its PostgreSQL or SeaweedFS did not start
        print(f"arkvory: {exc}", file=sys.stderr)
        return exc.exit_status


@dataclasses.dataclass
class _Tally:
    total: int
    total_bytes: int
    done: int = 0
    done_bytes: int = 0
    copied: int = 0
    present: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)


async def migrate_storage(
    settings: Any, environ: Mapping[str, str], to_url: str, *, out: TextIO = sys.stdout, dev_dir: str | None = None,
) -> int:
    """The whole command; an exit status. `dev_dir`: the stopped `arkvory dev` it works on."""
    from arkvory.shared import db
    from arkvory.shared.errors import StartupError
    from arkvory.shared.storage import StorageError, StorageRefused, recorded_storage
    from arkvory.writer.audit.trail import Entry, record_tool_change
    from arkvory.writer.worker.offline import ServersUp, take_offline_locks

    try:
        conn = await db.connect(settings.database_url, server_settings={"application_name": APPLICATION_NAME})
    except StartupError as exc:
        print(f"arkvory: {exc}", file=sys.stderr)
        return exc.exit_status
    try:
        try:
            await take_offline_locks(conn)
        except ServersUp as exc:
            print(f"arkvory: refusing to migrate the storage while servers are up:\n{exc}\n"
                  "stop them (every gateway, the writer and every worker, standby ones too) and run it again",
                  file=sys.stderr)
            return EXIT_REFUSED
        storage_id, location = await recorded_storage(conn)
        if storage_id is None:
            print("arkvory: the database records no storage yet: nothing to migrate (start the writer once,"
                  " or run arkvory admin init, with ARKVORY_STORAGE_URL set to where the blobs should live)",
                  file=sys.stderr)
            return EXIT_CONFIG
        if location == to_url:
            print(f"the storage is already {to_url}: nothing to do", file=out)
            return EXIT_OK
        try:
            source = await _open_side(environ, settings.data_dir, location, storage_id, create=False)
            target = await _open_side(environ, settings.data_dir, to_url, storage_id, create=True)
        except StartupError as exc:
            print(f"arkvory: {exc}", file=sys.stderr)
            return exc.exit_status
        rows = await conn.fetch("SELECT sha256, size FROM arkvory_blobs ORDER BY sha256", timeout=db.QUERY_TIMEOUT_S)
        tally = _Tally(len(rows), sum(r["size"] for r in rows))
        print(f"migrating {tally.total} blobs ({_size(tally.total_bytes)}) from {location} to {to_url}", file=out,
              flush=True)
        started = last = time.monotonic()
        _remove_leftovers(settings.data_dir)
        try:
            for row in rows:
                await _migrate_blob(source, target, row["sha256"], row["size"], settings.data_dir, tally)
                now = time.monotonic()
                if tally.done == 1 or now - last >= PROGRESS_EVERY_S or tally.done == tally.total:
                    last = now
                    _progress(tally, now - started, out)
        except StorageRefused as exc:
            print(f"arkvory: {exc.message}", file=sys.stderr)
            return EXIT_CONFIG
        except StorageError as exc:
            print(f"arkvory: {exc.message}\nnothing was switched; run the command again once the storage"
                  " answers: it continues where it stopped", file=sys.stderr)
            return EXIT_UNAVAILABLE
        if tally.problems:
            print(f"arkvory: {len(tally.problems)} blobs could not be copied; nothing was switched:", file=sys.stderr)
            for line in tally.problems:
                print(f"  {line}", file=sys.stderr)
            print("run arkvory admin scrub (or a verify task) and re-upload what it reports, then run this"
                  " again", file=sys.stderr)
            return EXIT_INCOMPLETE
        async with conn.transaction():
            switched = await conn.execute(
                "UPDATE arkvory_storage SET location = $1 WHERE storage_id = $2 AND location = $3",
                to_url, uuid.UUID(storage_id), location, timeout=db.QUERY_TIMEOUT_S,
            )
            if switched == "UPDATE 1":
                await record_tool_change(conn, "arkvory admin migrate-storage", Entry(
                    "storage.migrate", target=to_url, details={"from": location, "copied": tally.copied,
                                                               "present": tally.present}))
        if switched != "UPDATE 1":
            print("arkvory: the recorded storage changed during the migration; nothing was switched", file=sys.stderr)
            return EXIT_INCOMPLETE
        print(f"switched: the database records {to_url} (storage id {storage_id}); {tally.copied} blobs copied,"
              f" {tally.present} were there already", file=out)
        for line in _next_steps(to_url, settings.data_dir, dev_dir):
            print(line, file=out)
        print(_old_copy_advice(location, settings.data_dir, source), file=out, flush=True)
        return EXIT_OK
    finally:
        await conn.close(timeout=db.QUERY_TIMEOUT_S)


async def _open_side(environ: Mapping[str, str], data_dir: pathlib.Path, url: str, storage_id: str, *, create: bool):
    """The storage at `url`, with this installation's id (given to an empty target)."""
    from arkvory.shared.errors import StartupRefused, StorageUnreachable
    from arkvory.shared.settings import object_store_for
    from arkvory.shared.storage import StorageRefused, StorageUnavailable
    from arkvory.shared.storage.directory import ID_FILE, Storage

    store_settings = object_store_for(environ, url)
    if store_settings is None:
        storage = Storage(data_dir)
        found = storage.read_id_file() if data_dir.is_dir() else None
        if found is None and create:
            data_dir.mkdir(parents=True, exist_ok=True)
            storage.create_layout(storage_id)
            found = storage_id
        if found != storage_id:
            raise StartupRefused(
                f"ARKVORY_DATA_DIR {data_dir} has {'no ' + ID_FILE if found is None else 'storage id ' + found},"
                f" but this installation's storage id is {storage_id}: wrong directory"
            )
        storage.create_layout(storage_id)  # missing sub-directories only
        return storage
    from arkvory.shared.storage.s3 import ObjectStorage

    storage = ObjectStorage(data_dir, store_settings)
    try:
        await storage.check()
        found = await storage.store.read_identity()
        if found is None and create:
            await storage.store.write_identity(storage_id)
            found = storage_id
    except StorageRefused as exc:
        raise StartupRefused(exc.message) from None
    except StorageUnavailable as exc:
        raise StorageUnreachable(exc.message) from None
    if found != storage_id:
        raise StartupRefused(
            f"{url} at {store_settings.endpoint_url or 'AWS S3'} has"
            f" {'no storage id' if found is None else 'storage id ' + found}, but this installation's is"
            f" {storage_id}: wrong bucket or prefix"
        )
    storage.create_local_dirs()
    return storage


async def _migrate_blob(source, target, sha256: str, size: int, data_dir: pathlib.Path, tally: _Tally) -> None:
    from arkvory.shared.storage import BlobNotFound

    tally.done += 1
    tally.done_bytes += size
    if await _present(target, sha256, size):
        tally.present += 1
        return
    if source.kind == "file":
        path = source.blob_file(sha256)
        found = await asyncio.to_thread(_hash_file, path)
        if found is None:
            tally.problems.append(f"{sha256}: missing from {source.location} ({path})")
            return
        if found != (size, sha256):
            tally.problems.append(f"{sha256}: corrupt in {source.location} ({found[0]} bytes, other digest)")
            return
        await target.stage(path, sha256, size)
        await target.publish(path, sha256, size, link=True)
        tally.copied += 1
        return
    # An object of another size is corrupt, not a store that fails: a ranged GET past its end
    # answers 416, which would stop the whole run as "unavailable", and every run after it.
    stat = await source.stat(sha256)
    if stat is None:
        tally.problems.append(f"{sha256}: missing from {source.location}")
        return
    if stat.size != size:
        tally.problems.append(f"{sha256}: corrupt in {source.location} ({stat.size} bytes, not {size})")
        return
    temporary = _temporary(data_dir, sha256)
    try:
        try:
            found = await _download(source, sha256, size, temporary)
        except BlobNotFound:
            tally.problems.append(f"{sha256}: missing from {source.location}")
            return
        if found != (size, sha256):
            tally.problems.append(f"{sha256}: corrupt in {source.location} ({found[0]} bytes, other digest)")
            return
        await target.stage(temporary, sha256, size)
        await target.publish(temporary, sha256, size)  # a directory renames it into place
        tally.copied += 1
    finally:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass


async def _present(target, sha256: str, size: int) -> bool:
    """Is a good copy there already (a run before this one made it)?"""
    found = await target.stat(sha256)
    if found is None or found.size != size:
        return False
    if target.kind == "file":
        return await asyncio.to_thread(_hash_file, target.blob_file(sha256)) == (size, sha256)
    return found.stored_sha256 == sha256  # recorded by a publish that hashed the bytes first


async def _download(source, sha256: str, size: int, path: str) -> tuple[int, str]:
    """Stream the blob into `path`, hashing it: (bytes, SHA-256)."""
    digest = hashlib.sha256()
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        async with source.open_range(sha256, 0, size, chunk_size=COPY_CHUNK) as reader:
            async for buffer in reader:
                written += await asyncio.to_thread(_write_and_hash, fd, digest, buffer)
        await asyncio.to_thread(os.fsync, fd)
    finally:
        os.close(fd)
    return written, digest.hexdigest()


def _write_and_hash(fd: int, digest: Any, buffer: Any) -> int:
    view = memoryview(buffer).cast("B")
    digest.update(view)
    done = 0
    while done < len(view):
        done += os.write(fd, view[done:])
    return len(view)


def _hash_file(path: str) -> tuple[int, str] | None:
    digest = hashlib.sha256()
    size = 0
    try:
        with open(path, "rb", buffering=0) as file:
            buffer = bytearray(HASH_CHUNK)
            while count := file.readinto(buffer):
                digest.update(memoryview(buffer)[:count])
                size += count
    except FileNotFoundError:
        return None
    return size, digest.hexdigest()


def _temporary(data_dir: pathlib.Path, sha256: str) -> str:
    from arkvory.shared.storage import UPLOAD_PREFIX

    # Named like an upload's temp file: the writer's start-up sweep removes one a crash left.
    return str(data_dir / "tmp" / f"{UPLOAD_PREFIX}migrate-{sha256[:16]}-{os.getpid()}")


def _remove_leftovers(data_dir: pathlib.Path) -> None:
    from arkvory.shared.storage import UPLOAD_PREFIX

    for leftover in (data_dir / "tmp").glob(f"{UPLOAD_PREFIX}migrate-*"):
        leftover.unlink(missing_ok=True)


def _progress(tally: _Tally, elapsed: float, out: TextIO) -> None:
    share = tally.done_bytes / tally.total_bytes if tally.total_bytes else 1.0
    print(
        f"[{elapsed:7.1f}s] {tally.done}/{tally.total} blobs, {_size(tally.done_bytes)} of {_size(tally.total_bytes)}"
        f" ({share:.0%}): {tally.copied} copied, {tally.present} already there"
        + (f", {len(tally.problems)} failed" if tally.problems else ""),
        file=out, flush=True,
    )


def _next_steps(to_url: str, data_dir: pathlib.Path, dev_dir: str | None) -> list[str]:
    """What the operator changes before starting the processes again: every process refuses a
    storage other than the one the database now records (exit 78)."""
    if dev_dir is not None:
        from .dev import _command

        storage = "file" if to_url == "file:" else "s3"
        return [f"now start it again with: {_command()} dev --dir {dev_dir} --storage {storage}"]
    if to_url == "file:":
        return [
            "now, for every process, before starting them:",
            "  - set ARKVORY_STORAGE_URL=file: (or remove it)",
            "  - remove ARKVORY_S3_ENDPOINT_URL, ARKVORY_S3_REGION and the AWS_* keys: nothing reads them now",
            "  - set ARKVORY_CACHE_MAX_BYTES=0 (or remove it): blobs in a directory need no read cache",
            f"  - give every process the one storage directory, ARKVORY_DATA_DIR={data_dir}: with a directory"
            " all of them run on this host (a gateway elsewhere has no copy of it)",
        ]
    return [
        f"now set ARKVORY_STORAGE_URL={to_url}, with the same ARKVORY_S3_ENDPOINT_URL, ARKVORY_S3_REGION"
        " and AWS_* keys this command used, for every process, and start them (ARKVORY_DATA_DIR becomes each"
        " host's local state; ARKVORY_CACHE_MAX_BYTES sizes its read cache)",
    ]


def _old_copy_advice(location: str, data_dir: pathlib.Path, source) -> str:
    if location == "file:":
        return (f"the old copy is left in {data_dir / 'blobs'}: once the processes serve from the new storage,"
                f" remove it with: rm -r {data_dir / 'blobs'}")
    endpoint = source.settings.endpoint_url
    where = f" --endpoint-url {endpoint}" if endpoint else ""
    return (f"the old copy is left in {location}/blobs/: once the processes serve from the new storage,"
            f" remove it with: aws s3 rm --recursive {location}/blobs/{where}")


def _size(count: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"
