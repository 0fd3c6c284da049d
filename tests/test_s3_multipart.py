"""shared/storage/s3_multipart.py and sigv4.py against a store that misbehaves: a real HTTP server
on a free port answering what a hostile or broken peer could (a DTD, an endless or oversized
answer, a redirect, refusals, listings that page wrongly), and the signer against AWS's own
published examples. The real store (SeaweedFS) is tests/test_s3_multipart_cleanup.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import http.server
import threading
import time
import urllib.parse

import pytest

from arkvory.shared.settings import ObjectStoreSettings
from arkvory.shared.storage import BlobNotFound, StorageRefused, StorageUnavailable
from arkvory.shared.storage.s3_multipart import MAX_ANSWER_BYTES, IncompleteUpload, MultipartUploads
from arkvory.shared.storage.sigv4 import signed_request

pytestmark = pytest.mark.timeout(60)

NS = 'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'
WHEN = "2026-01-02T03:04:05.000Z"


class Peer:
    """A local HTTP server; `answer(handler)` decides each answer, `seen` keeps the requests."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict]] = []
        self.answer = lambda handler: (200, {}, b"")
        self.date: str | None = None  # the Date header the answers carry (None: the real time)
        peer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._serve()

            def do_DELETE(self) -> None:
                self._serve()

            def _serve(self) -> None:
                peer.seen.append((self.command, self.path, dict(self.headers)))
                result = peer.answer(self)
                if result is None:
                    return  # the handler wrote (or withheld) the answer itself
                status, headers, body = result
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def date_time_string(self, timestamp=None) -> str:
                return peer.date or super().date_time_string(timestamp)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def queries(self) -> list[dict[str, str]]:
        return [dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(path).query, keep_blank_values=True))
                for _, path, _ in self.seen]


@pytest.fixture
def peer():
    server = Peer()
    yield server
    server.close()


def uploads_of(peer: Peer, **settings) -> MultipartUploads:
    given = dict(bucket="b", prefix="inst", endpoint_url=peer.url, access_key_id="AKTEST",
                 secret_access_key="secret-test")
    given.update(settings)
    return MultipartUploads(ObjectStoreSettings(**given), read_timeout=1.0, request_timeout=2.0)


async def all_pages(uploads: MultipartUploads) -> list:
    return [page async for page in uploads.pages("blobs/")]


def listing(*uploads: tuple[str, str, str], truncated: bool = False, next_key: str = "", next_id: str = "") -> bytes:
    entries = "".join(
        f"<Upload><Key>{key}</Key><UploadId>{upload_id}</UploadId><Initiated>{initiated}</Initiated></Upload>"
        for key, upload_id, initiated in uploads
    )
    markers = (f"<NextKeyMarker>{next_key}</NextKeyMarker>" if next_key else "") + (
        f"<NextUploadIdMarker>{next_id}</NextUploadIdMarker>" if next_id else "")
    return (f'<?xml version="1.0" encoding="UTF-8"?><ListMultipartUploadsResult {NS}><Bucket>b</Bucket>'
            f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>{markers}{entries}"
            "</ListMultipartUploadsResult>").encode()


def test_the_signer_matches_aws_published_examples():
    """AWS's SigV4 examples for S3 (GET ?lifecycle and GET ?max-keys=2&prefix=J, 2013-05-24)."""
    now = datetime.datetime(2013, 5, 24, tzinfo=datetime.timezone.utc)
    keys = dict(region="us-east-1", access_key_id="AKIAIOSFODNN7EXAMPLE",
                secret_access_key="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", now=now)
    for query, signature in (
        ({"lifecycle": ""}, "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"),
        ({"max-keys": "2", "prefix": "J"}, "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"),
    ):
        request = signed_request("GET", "https://examplebucket.s3.amazonaws.com", "/", query=query, **keys)
        assert request.get_header("Authorization").endswith(f"Signature={signature}")
    token = signed_request("GET", "https://examplebucket.s3.amazonaws.com", "/", session_token="TOKEN", **keys)
    assert token.get_header("X-amz-security-token") == "TOKEN"
    assert "SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token," in token.get_header("Authorization")


def test_without_static_keys_it_says_why_it_cannot_sign(peer):
    uploads = uploads_of(peer, access_key_id=None, secret_access_key=None)
    assert "AWS_ACCESS_KEY_ID is not set" in uploads.unsupported
    assert "credential chain" in uploads.unsupported
    assert uploads_of(peer).unsupported is None


def test_pages_follow_the_markers_each_store_gives_and_skip_what_cannot_be_judged(peer):
    pages = iter([
        # AWS: key order, both markers.
        listing(("inst/blobs/a", "u1", WHEN), ("other/blobs/x", "u2", WHEN), ("inst/blobs/b", "u3", "yesterday"),
                truncated=True, next_key="inst/blobs/b", next_id="u3"),
        # SeaweedFS: by upload id, only NextUploadIdMarker.
        listing(("inst/blobs/c", "u4", "2026-01-02T03:04:05Z"), truncated=True, next_id="u4"),
        listing(("inst/blobs/d", "u5", WHEN)),
    ])
    peer.date = "Fri, 02 Jan 2026 04:04:05 GMT"
    peer.answer = lambda handler: (200, {}, next(pages))
    found = asyncio.run(all_pages(uploads_of(peer)))
    assert [[u.key for u in page.uploads] for page in found] == [["blobs/a"], ["blobs/c"], ["blobs/d"]]
    assert found[0].store_time == datetime.datetime(2026, 1, 2, 4, 4, 5, tzinfo=datetime.timezone.utc)
    assert found[0].uploads[0].initiated == datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    queries = peer.queries()
    assert all(q["uploads"] == "" and q["prefix"] == "inst/blobs/" and q["max-uploads"] == "1000" for q in queries)
    assert "key-marker" not in queries[0] and "upload-id-marker" not in queries[0]
    assert (queries[1]["key-marker"], queries[1]["upload-id-marker"]) == ("inst/blobs/b", "u3")
    assert "key-marker" not in queries[2] and queries[2]["upload-id-marker"] == "u4"
    assert all(headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKTEST/")
               for _, _, headers in peer.seen)
    assert all("secret-test" not in path and "secret-test" not in str(headers) for _, path, headers in peer.seen)


def test_a_listing_that_says_more_but_does_not_move_on_ends(peer):
    peer.answer = lambda handler: (200, {}, listing(("inst/blobs/a", "u1", WHEN), truncated=True, next_id="u1"))
    with pytest.raises(StorageUnavailable, match="did not move on"):
        asyncio.run(all_pages(uploads_of(peer)))
    assert len(peer.seen) == 2


@pytest.mark.parametrize("body, why", [
    (b'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;">]>'
     b"<ListMultipartUploadsResult><IsTruncated>&b;</IsTruncated></ListMultipartUploadsResult>",
     "document type declaration"),
    ("<?xml version='1.0' encoding='UTF-16'?><a/>".encode("utf-16"), "not UTF-8"),
    (b"<ListMultipartUploadsResult><Upload>", "not well-formed"),
], ids=["dtd", "utf16", "broken"])
def test_xml_with_a_dtd_or_not_utf8_or_broken_is_refused_before_it_is_used(peer, body, why):
    peer.answer = lambda handler: (200, {}, body)
    with pytest.raises(StorageUnavailable, match=why):
        asyncio.run(all_pages(uploads_of(peer)))


def test_an_answer_past_the_bound_is_refused_unread(peer):
    peer.answer = lambda handler: (200, {}, b" " * (MAX_ANSWER_BYTES + 1))
    with pytest.raises(StorageUnavailable, match=f"more than {MAX_ANSWER_BYTES} bytes"):
        asyncio.run(all_pages(uploads_of(peer)))


def test_an_answer_that_never_ends_is_given_up_on_time(peer):
    def drip(handler):
        handler.send_response(200)
        handler.send_header("Content-Length", str(10**9))
        handler.end_headers()
        with contextlib.suppress(OSError):
            for _ in range(200):  # a byte every 0.1 s: never silent for the read timeout
                handler.wfile.write(b" ")
                handler.wfile.flush()
                time.sleep(0.1)

    peer.answer = drip
    started = time.monotonic()
    with pytest.raises(StorageUnavailable, match="timed out"):
        asyncio.run(all_pages(uploads_of(peer)))
    assert time.monotonic() - started < 5.0  # request_timeout 2 s + read_timeout 1 s, and some slack


def test_a_redirect_is_not_followed(peer):
    elsewhere = Peer()
    try:
        peer.answer = lambda handler: (307, {"Location": f"{elsewhere.url}/b?uploads"}, b"")
        with pytest.raises(StorageUnavailable):
            asyncio.run(all_pages(uploads_of(peer)))
        assert elsewhere.seen == []
    finally:
        elsewhere.close()


@pytest.mark.parametrize("status, code, error, says", [
    (403, "AccessDenied", StorageRefused, "s3:ListBucketMultipartUploads"),
    (501, "NotImplemented", StorageRefused, "does not support"),
    (404, "NoSuchBucket", StorageRefused, "does not exist"),
    (500, "InternalError", StorageUnavailable, "HTTP 500"),
])
def test_refusals_name_what_to_look_at(peer, status, code, error, says):
    peer.answer = lambda handler: (status, {}, f"<Error><Code>{code}</Code></Error>".encode())
    with pytest.raises(error, match=says) as raised:
        asyncio.run(all_pages(uploads_of(peer)))
    assert "secret-test" not in raised.value.message


def test_parts_sum_their_sizes_and_find_the_newest_and_an_abort_of_a_gone_upload_is_fine(peer):
    upload = IncompleteUpload("blobs/a", "u/1+", datetime.datetime(2026, 1, 2, tzinfo=datetime.timezone.utc))
    pages = iter([
        f"<ListPartsResult {NS}><IsTruncated>true</IsTruncated><NextPartNumberMarker>1</NextPartNumberMarker>"
        f"<Part><PartNumber>1</PartNumber><LastModified>2026-01-02T03:00:00.000Z</LastModified><Size>10</Size></Part>"
        "</ListPartsResult>",
        f"<ListPartsResult {NS}><IsTruncated>false</IsTruncated>"
        f"<Part><PartNumber>2</PartNumber><LastModified>2026-01-02T03:30:00.000Z</LastModified><Size>5</Size></Part>"
        "</ListPartsResult>",
    ])

    def answer(handler):
        if handler.command == "DELETE":
            return 404, {}, b"<Error><Code>NoSuchUpload</Code></Error>"
        return 200, {}, next(pages).encode()

    peer.answer = answer
    uploads = uploads_of(peer)
    parts = asyncio.run(uploads.parts(upload))
    assert (parts.count, parts.bytes) == (2, 15)
    assert parts.last_part == datetime.datetime(2026, 1, 2, 3, 30, tzinfo=datetime.timezone.utc)
    asyncio.run(uploads.abort(upload))  # NoSuchUpload: gone already, fine
    paths = [urllib.parse.urlsplit(path) for _, path, _ in peer.seen]
    assert [p.path for p in paths] == ["/b/inst/blobs/a"] * 3
    assert urllib.parse.parse_qs(paths[1].query)["part-number-marker"] == ["1"]
    assert urllib.parse.parse_qs(paths[2].query) == {"uploadId": ["u/1+"]}
    peer.answer = lambda handler: (404, {}, b"<Error><Code>NoSuchUpload</Code></Error>")
    with pytest.raises(BlobNotFound):
        asyncio.run(uploads.parts(upload))


def test_the_cleanup_step_without_static_keys_is_skipped_with_a_warning(database_url, tmp_path, caplog):
    """Credentials from the AWS chain (no AWS_ACCESS_KEY_ID): nothing is sent, the step says why
    in its result and in the log, and the task goes on."""
    import asyncpg

    from arkvory.shared.settings import Settings
    from arkvory.shared.storage.s3 import ObjectStorage
    from arkvory.writer.maintenance.multipart_uploads import abort_abandoned_uploads
    from arkvory.writer.worker.offline import OfflineContext

    settings = Settings.from_env({
        "ARKVORY_DATABASE_URL": database_url, "ARKVORY_DATA_DIR": str(tmp_path),
        "ARKVORY_STORAGE_URL": "s3://blobs/inst", "ARKVORY_S3_ENDPOINT_URL": "http://127.0.0.1:9",
    })
    storage = ObjectStorage(tmp_path, settings.object_store)

    async def run() -> dict:
        pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
        try:
            return await abort_abandoned_uploads(OfflineContext("cleanup", {}, pool, storage, settings), 0)
        finally:
            await pool.close()

    result = asyncio.run(run())
    assert result["aborted"] == 0 and "AWS_ACCESS_KEY_ID is not set" in result["skipped"]
    assert "not aborting the object store's incomplete multipart uploads: AWS_ACCESS_KEY_ID is not set" in caplog.text
    assert "lifecycle rule" in caplog.text
