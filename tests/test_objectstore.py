"""shared/storage/s3_client.py against a real SeaweedFS (tests/s3store.py): exact ranges, multipart
publishing, cut streams that leave no connection behind, a store killed mid-stream, and the
errors an operator sees for wrong credentials or a missing bucket. No S3 mock anywhere."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import pathlib
import random

import obstore
import pytest

from arkvory.shared.settings import Settings, SettingsError
from arkvory.shared.storage.s3_client import (
    IDENTITY_KEY,
    NotFound,
    ObjectStore,
    Refused,
    Unavailable,
)

from .s3store import Bucket

MiB = 1024 * 1024
PART = 5 * MiB  # S3's smallest part


def run(coroutine):
    return asyncio.run(coroutine)


def store_of(bucket: Bucket, prefix: str = "", **overrides: str) -> ObjectStore:
    environ = {**bucket.environ(prefix), **overrides}
    return ObjectStore(object_store_settings(environ), connect_timeout=2.0, read_timeout=10.0)


def object_store_settings(environ: dict[str, str]):
    """The object store's part of the settings (shared/settings.py reads and checks them)."""
    base = {"ARKVORY_DATABASE_URL": "postgresql://arkvory@127.0.0.1/arkvory", "ARKVORY_DATA_DIR": "/nonexistent"}
    return Settings.from_env({**base, **environ}).object_store


def blob(tmp_path: pathlib.Path, size: int, name: str = "blob") -> tuple[pathlib.Path, bytes, str]:
    data = random.Random(size).randbytes(size)
    path = tmp_path / name
    path.write_bytes(data)
    return path, data, hashlib.sha256(data).hexdigest()


def key_of(sha256: str) -> str:
    return f"blobs/sha256/{sha256[:2]}/{sha256[2:4]}/{sha256}"


def connections_to(port: int) -> int:
    """Established TCP connections of this process to 127.0.0.1:port (the client's pool)."""
    inodes = set()
    for fd in pathlib.Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    count = 0
    for line in pathlib.Path("/proc/self/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "01" and fields[9] in inodes and int(fields[2].split(":")[1], 16) == port:
            count += 1
    return count


async def read_all(store: ObjectStore, key: str, start: int, length: int, **kw) -> bytes:
    async with store.open_range(key, start, length, **kw) as reader:
        return b"".join([bytes(buffer) async for buffer in reader])


# --- settings -----------------------------------------------------------------------------------


def problems_of(environ: dict[str, str]) -> list[str]:
    with pytest.raises(SettingsError) as caught:
        object_store_settings(environ)
    return caught.value.problems


def test_storage_urls_parse_and_bad_ones_name_the_variable() -> None:
    assert object_store_settings({"ARKVORY_STORAGE_URL": "s3://bucket"}).url == "s3://bucket"
    parsed = object_store_settings({"ARKVORY_STORAGE_URL": "s3://my.bucket-1/a/b/"})
    assert (parsed.bucket, parsed.prefix) == ("my.bucket-1", "a/b")
    assert object_store_settings({"ARKVORY_STORAGE_URL": "file:"}) is None
    for bad in ("s3://", "s3://B", "s3://ab", "s3://b..b", "s3://bucket/a//b",
                "s3://bucket/../x", "s3://user:pw@bucket", "https://bucket/x", "s3://bucket?x=1"):
        (line,) = problems_of({"ARKVORY_STORAGE_URL": bad})
        assert line.startswith("ARKVORY_STORAGE_URL: "), line
        assert "pw" not in line


def test_settings_come_from_the_environment_and_never_show_a_secret() -> None:
    secret, token = "s3cr3t-Value-never-shown", "session-token-never-shown"
    settings = object_store_settings({
        "ARKVORY_STORAGE_URL": "s3://bucket/pre",
        "ARKVORY_S3_ENDPOINT_URL": "http://127.0.0.1:9000/",
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_SESSION_TOKEN": token,
    })
    assert (settings.bucket, settings.prefix, settings.region) == ("bucket", "pre", "us-east-1")
    assert settings.endpoint_url == "http://127.0.0.1:9000"
    assert settings.secret_access_key == secret and settings.session_token == token
    shown = repr(settings) + str(settings) + repr(ObjectStore(settings))
    assert secret not in shown and token not in shown and "AKIDEXAMPLE" in shown

    assert problems_of({"ARKVORY_STORAGE_URL": "s3://bucket", "AWS_ACCESS_KEY_ID": "AK"}) == [
        "AWS_SECRET_ACCESS_KEY: not set, but AWS_ACCESS_KEY_ID is; set both or neither"
    ]
    (line,) = problems_of({"ARKVORY_STORAGE_URL": "s3://bucket", "ARKVORY_S3_REGION": "US EAST"})
    assert line.startswith("ARKVORY_S3_REGION: ")
    for endpoint in ("ftp://host", "http://", "http://host:99999", "localhost:9000"):
        (line,) = problems_of({"ARKVORY_STORAGE_URL": "s3://bucket", "ARKVORY_S3_ENDPOINT_URL": endpoint})
        assert line.startswith("ARKVORY_S3_ENDPOINT_URL: ")
    (line,) = problems_of(
        {"ARKVORY_STORAGE_URL": "s3://bucket", "ARKVORY_S3_ENDPOINT_URL": f"http://AK:{secret}@host:9000"}
    )
    assert line.startswith("ARKVORY_S3_ENDPOINT_URL: must not contain") and secret not in line
    (line,) = problems_of({"ARKVORY_STORAGE_URL": "file:", "ARKVORY_S3_ENDPOINT_URL": "http://h:1"})
    assert line.startswith("ARKVORY_S3_ENDPOINT_URL: expected to be unset with ARKVORY_STORAGE_URL=file:")
    (line,) = problems_of({"ARKVORY_CACHE_MAX_BYTES": "1048576"})
    assert line.startswith("ARKVORY_CACHE_MAX_BYTES: expected 0 (off) with ARKVORY_STORAGE_URL=file:")
    assert problems_of({"ARKVORY_STORAGE_URL": "s3://bucket", "ARKVORY_CACHE_MAX_BYTES": "-1"})[0].startswith(
        "ARKVORY_CACHE_MAX_BYTES: expected an integer in 0..")


# --- reading and writing ------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_multipart_publish_then_byte_exact_ranges(s3_bucket: Bucket, tmp_path) -> None:
    path, data, sha = blob(tmp_path, 3 * PART + 12_345)  # four parts, the last a short one
    size, key = len(data), key_of(sha)

    async def scenario() -> None:
        store = store_of(s3_bucket, "inst-a")
        stat = await store.publish(path, key, sha, part_size=PART)
        assert (stat.size, stat.sha256, stat.key) == (size, sha, key)
        assert stat.etag.strip('"').endswith("-4")  # S3's multipart ETag: md5 of md5s, -parts
        assert (await store.stat(key)).sha256 == sha

        ranges = [(0, size), (0, 1), (size - 1, 1), (1, 100), (PART - 3, 7), (PART, PART),
                  (2 * PART - 1, PART + 2), (size - 12_345, 12_345), (17, 0)]
        rng = random.Random(7)
        ranges += [(s, rng.randrange(0, size - s + 1)) for s in rng.sample(range(size), 20)]
        for start, length in ranges:
            for chunk in (64 * 1024, 1 * MiB):
                got = await read_all(store, key, start, length, chunk_size=chunk)
                assert got == data[start:start + length], (start, length, chunk)

        # Buffers are about chunk_size each: ~1 Python call per chunk_size bytes.
        async with store.open_range(key, 0, size, chunk_size=MiB) as reader:
            sizes = [len(memoryview(b)) async for b in reader]
        assert all(s >= MiB for s in sizes[:-1]) and len(sizes) <= size // MiB + 1
        assert reader.stat.size == size and reader.stat.sha256 == sha

        # readinto fills a caller's buffer across chunk boundaries.
        out, buffer = bytearray(), bytearray(300_001)
        async with store.open_range(key, 5, size - 10, chunk_size=64 * 1024) as reader:
            while n := await reader.readinto(buffer):
                out += buffer[:n]
        assert out == data[5:size - 5]

        # Never silently short: a range past the end (a blob shorter than recorded) fails.
        for start, length in ((size - 10, 11), (size, 1), (size + 100, 5)):
            with pytest.raises(Unavailable, match=r"^(ARKVORY_S3_ENDPOINT_URL|object store): "):
                await read_all(store, key, start, length)

        with pytest.raises(NotFound):
            await store.stat(key_of("0" * 64))
        with pytest.raises(NotFound):
            await read_all(store, key_of("0" * 64), 0, 10)

    run(scenario())


@pytest.mark.timeout(120)
def test_nothing_partial_is_ever_visible_and_an_existing_good_blob_is_kept(
    s3_bucket: Bucket, tmp_path
) -> None:
    path, data, sha = blob(tmp_path, 4 * PART + 1)
    key = key_of(sha)

    async def scenario() -> None:
        store = store_of(s3_bucket)
        seen: list[tuple[int, str | None]] = []
        publishing = asyncio.create_task(store.publish(path, key, sha, part_size=PART))
        while not publishing.done():
            with contextlib.suppress(NotFound):
                stat = await store.stat(key)
                seen.append((stat.size, stat.sha256))
            await asyncio.sleep(0)
        first = await publishing
        assert all(s == (len(data), sha) for s in seen), seen[:3]

        # Published again: the object is verified by HEAD (size + stored SHA-256) and kept.
        again = await store.publish(path, key, sha, part_size=PART)
        assert (again.etag, again.last_modified) == (first.etag, first.last_modified)

        # A wrong object at the key (no SHA-256, or other bytes) is replaced.
        await obstore.put_async(store._store, store._full(key), b"corrupt")
        assert (await store.stat(key)).sha256 is None
        fixed = await store.publish(path, key, sha, part_size=PART)
        assert (fixed.size, fixed.sha256) == (len(data), sha)
        assert await read_all(store, key, 0, len(data)) == data

        # A small blob goes in one PUT, with its SHA-256 all the same.
        small, small_data, small_sha = blob(tmp_path, 1000, "small")
        stat = await store.publish(small, key_of(small_sha), small_sha)
        assert (stat.size, stat.sha256) == (1000, small_sha) and "-" not in stat.etag
        await store.delete(key_of(small_sha))
        await store.delete(key_of(small_sha))  # absent: fine
        with pytest.raises(NotFound):
            await store.stat(key_of(small_sha))

    run(scenario())


@pytest.mark.timeout(120)
def test_list_pages_in_key_order_resumes_after_a_key_and_respects_the_prefix(
    s3_bucket: Bucket,
) -> None:
    async def scenario() -> None:
        store = store_of(s3_bucket, "inst/a")
        other = store_of(s3_bucket, "inst/b")
        keys = sorted(key_of(hashlib.sha256(str(i).encode()).hexdigest()) for i in range(25))
        for k in keys:
            await obstore.put_async(store._store, store._full(k), k.encode())
        await obstore.put_async(other._store, other._full(keys[0]), b"elsewhere")
        await obstore.put_async(store._store, store._full("blobsx/not-under-blobs"), b"x")

        pages = [page async for page in store.list("blobs", page_size=10)]
        listed = [o.key for page in pages for o in page]
        assert listed == keys  # relative to the prefix, nothing from inst/b or blobsx
        assert [len(p) for p in pages] == [10, 10, 5]
        assert all(o.size == len(o.key) for page in pages for o in page)

        rest = [o.key async for page in store.list("blobs/", after=keys[11]) for o in page]
        assert rest == keys[12:]
        everything = [o.key async for page in store.list() for o in page]
        assert everything == [*keys, "blobsx/not-under-blobs"]
        assert [o.key async for page in other.list() for o in page] == [keys[0]]

    run(scenario())


@pytest.mark.timeout(120)
def test_identity_is_created_once_and_another_installations_store_is_refused(
    s3_bucket: Bucket,
) -> None:
    async def scenario() -> None:
        store = store_of(s3_bucket, "site")
        assert await store.read_identity() is None
        await store.write_identity("id-one")
        assert await store.read_identity() == "id-one"
        await store.write_identity("id-one")  # the same id again: fine
        with pytest.raises(
            Refused, match=r"^ARKVORY_STORAGE_URL: .*another installation"
        ) as caught:
            await store.write_identity("id-two")
        assert caught.value.setting == "ARKVORY_STORAGE_URL"
        assert await store.read_identity() == "id-one"
        # It lives at PREFIX/arkvory-storage-id; another prefix is another storage.
        unprefixed = store_of(s3_bucket)
        assert (await unprefixed.stat(f"site/{IDENTITY_KEY}")).size == len("id-one\n")
        assert await store_of(s3_bucket, "elsewhere").read_identity() is None

    run(scenario())


# --- failures -----------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_wrong_credentials_are_refused_naming_the_setting_and_never_the_secret(
    s3_bucket: Bucket,
) -> None:
    secret = "wrong-secret-" + "x" * 27

    async def scenario() -> None:
        good = store_of(s3_bucket)
        await good.write_identity("id-one")
        for overrides in (
            {"AWS_SECRET_ACCESS_KEY": secret},
            {"AWS_ACCESS_KEY_ID": "AKNOSUCHKEY0000000", "AWS_SECRET_ACCESS_KEY": secret},
        ):
            store = store_of(s3_bucket, **overrides)
            for attempt in (store.check(), store.read_identity(), store.stat(IDENTITY_KEY),
                            read_all(store, IDENTITY_KEY, 0, 1)):
                with pytest.raises(Refused) as caught:
                    await attempt
                message = str(caught.value)
                assert message.startswith("AWS_ACCESS_KEY_ID: ") and "\n" not in message
                assert "AWS_SECRET_ACCESS_KEY" in message
                assert secret not in message
                assert s3_bucket.store.credentials.secret_access_key not in message
                assert caught.value.setting == "AWS_ACCESS_KEY_ID"

    run(scenario())


@pytest.mark.timeout(120)
def test_a_missing_bucket_is_refused_naming_the_storage_url(s3_bucket: Bucket, tmp_path) -> None:
    async def scenario() -> None:
        store = store_of(s3_bucket, ARKVORY_STORAGE_URL="s3://no-such-bucket-here/pre")
        for attempt in (store.check(), store.read_identity(), store.write_identity("x"),
                        store.list().__anext__()):
            with pytest.raises(
                Refused, match=r"^ARKVORY_STORAGE_URL: the bucket 'no-such-bucket-here'"
            ) as caught:
                await attempt
            assert "\n" not in str(caught.value)
        path, _, sha = blob(tmp_path, 100)
        with pytest.raises(Refused, match=r"^ARKVORY_STORAGE_URL: "):
            await store.publish(path, key_of(sha), sha)

    run(scenario())


@pytest.mark.timeout(120)
def test_a_cut_stream_gives_its_connection_back(s3_bucket: Bucket, tmp_path) -> None:
    path, data, sha = blob(tmp_path, 6 * PART)
    key = key_of(sha)
    port = int(s3_bucket.store.endpoint_url.rsplit(":", 1)[1])

    async def settled(limit: int) -> int:
        for _ in range(100):
            if (count := connections_to(port)) <= limit:
                return count
            await asyncio.sleep(0.05)
        return connections_to(port)

    async def scenario() -> None:
        store = store_of(s3_bucket)
        await store.publish(path, key, sha, part_size=PART)
        await read_all(store, key, 0, 10)  # the pool holds its idle connections now
        baseline = connections_to(port)

        readers = [store.open_range(key, i * 1000, len(data) - i * 1000, chunk_size=64 * 1024)
                   for i in range(20)]
        for reader in readers:
            await reader.open()
            await reader.__anext__()
        assert connections_to(port) >= 20
        for reader in readers[:10]:
            await reader.aclose()  # cut on purpose

        async def read_slowly(reader) -> None:
            async for _ in reader:
                await asyncio.sleep(0.01)

        tasks = [asyncio.create_task(read_slowly(r)) for r in readers[10:]]
        await asyncio.sleep(0.1)
        for task in tasks:
            task.cancel()  # cut by cancellation, as a client that goes away
        await asyncio.gather(*tasks, return_exceptions=True)
        for reader in readers[10:]:
            await reader.aclose()
        del readers, tasks
        assert await settled(baseline) <= baseline

        # The pool works on: a full read right after.
        assert await read_all(store, key, 0, len(data)) == data
        assert await settled(baseline + 1) <= baseline + 1

    run(scenario())


@pytest.mark.timeout(180)
def test_the_store_killed_mid_stream_cuts_it_and_serving_resumes_when_it_is_back(
    s3_bucket: Bucket, tmp_path
) -> None:
    path, data, sha = blob(tmp_path, 64 * MiB)
    key = key_of(sha)
    seaweed = s3_bucket.store

    async def scenario() -> None:
        store = store_of(s3_bucket)
        await store.publish(path, key, sha, part_size=16 * MiB)
        received = 0
        with pytest.raises(Unavailable) as caught:
            async with store.open_range(key, 0, len(data), chunk_size=64 * 1024) as reader:
                async for buffer in reader:
                    received += len(memoryview(buffer))
                    if seaweed.running:
                        await asyncio.to_thread(seaweed.kill)
        assert received < len(data)
        assert str(caught.value).startswith("ARKVORY_S3_ENDPOINT_URL: ")

        # Down: new reads and writes fail at once with Unavailable, naming the endpoint setting.
        for attempt in (store.stat(key), read_all(store, key, 0, 10), store.check(),
                        store.read_identity(), store.publish(path, key_of("1" * 64), "1" * 64)):
            with pytest.raises(Unavailable, match=r"^ARKVORY_S3_ENDPOINT_URL: ") as caught:
                await attempt
            assert "\n" not in str(caught.value)

        await asyncio.to_thread(seaweed.restart)
        # Back: the same client serves again, nothing lost.
        assert await read_all(store, key, 0, len(data)) == data
        assert (await store.stat(key)).sha256 == sha

    run(scenario())
