"""A resumable upload published while its parts arrive, fed from the received bytes
(writer/uploads/sessions.py `InlineFeed`, writer/uploads/store.py): the part the whole-file hash
needs next is hashed and sent to the store as it is received, not read back from the session
file; out of order parts (and unaligned part sizes, written partly past O_DIRECT) are read back
and still publish byte-exact; a part with a wrong X-Content-SHA256 or cut midway never reaches
the published object, and the session resumes into the right one."""

from __future__ import annotations

import hashlib
import os
import signal
import time
import uuid

import pytest

from .test_uploads import send_half_a_part

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

MiB = 1024 * 1024
REPO = "builds"
BASE = f"/api/v1/repositories/{REPO}/uploads"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def create(client, data: bytes, part_size: int) -> dict:
    descriptor = {"name": "big.bin", "size": len(data), "sha256": sha(data), "partSize": part_size}
    answer = client.post(BASE, json=descriptor, headers={"Idempotency-Key": uuid.uuid4().hex})
    assert answer.status_code == 201, answer.text
    return answer.json()


def put_part(client, session: dict, index: int, data: bytes, *, body: bytes | None = None):
    size = session["partSize"]
    part = data[index * size:(index + 1) * size]
    return client.put(f"{BASE}/{session['id']}/parts/{index}", content=part if body is None else body,
                      headers={"X-Content-SHA256": sha(part)})


def complete_and_download(client, session: dict, data: bytes) -> None:
    done = client.post(f"{BASE}/{session['id']}/complete")
    assert done.status_code == 201, done.text
    body = client.get(f"/api/v1/repositories/{REPO}/artifacts/{done.json()['id']}/content")
    assert body.status_code == 200 and body.content == data


def bytes_read(pid: int) -> int:
    """What the process passed to read(2) and its kin: its sockets' bodies and any file read back."""
    with open(f"/proc/{pid}/io") as io:
        return int(next(line for line in io if line.startswith("rchar:")).split()[1])


def test_parts_in_order_are_hashed_and_published_as_received_never_read_back(s3_cluster):  # noqa: F811
    writer = s3_cluster.writer().wait_ready()
    data = os.urandom(6 * MiB + 12345)
    with writer.client(timeout=120) as client:
        assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
        session = create(client, data, MiB)
        before = bytes_read(writer.proc.pid)
        for index in range(session["partCount"]):
            assert put_part(client, session, index, data).status_code == 200
        assert not s3_cluster.has_blob(sha(data))
        complete_and_download(client, session, data)
    # The bodies were read once from their sockets (and the download is sent, not read);
    # reading the session file back to hash or publish it would read it all a second time.
    assert bytes_read(writer.proc.pid) - before < 1.5 * len(data)
    assert s3_cluster.has_blob(sha(data))


def test_parts_out_of_order_with_an_unaligned_part_size_publish_byte_exact(s3_cluster):  # noqa: F811
    writer = s3_cluster.writer().wait_ready()
    part_size = MiB + 513  # every part after the first starts off a disk block
    data = os.urandom(5 * part_size + 777)
    with writer.client(timeout=120) as client:
        assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
        session = create(client, data, part_size)
        for index in (0, 2, 1, 5, 3, 4):  # 1 fed as it arrives, 2 then read back; 3..5 likewise
            assert put_part(client, session, index, data).status_code == 200
        complete_and_download(client, session, data)


def test_a_part_with_a_wrong_sha256_never_reaches_the_published_object(s3_cluster):  # noqa: F811
    writer = s3_cluster.writer().wait_ready()
    data = os.urandom(4 * MiB)
    with writer.client(timeout=120) as client:
        assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
        session = create(client, data, MiB)
        assert put_part(client, session, 0, data).status_code == 200
        assert put_part(client, session, 1, data).status_code == 200
        # The last part, then the one the prefix needs next: other bytes of the same length
        # than their X-Content-SHA256 says.
        for index, filler in ((3, b"\0"), (2, b"\1")):
            wrong = put_part(client, session, index, data, body=filler * MiB)
            assert wrong.status_code == 422 and wrong.json()["code"] == "digest_mismatch", wrong.text
        assert client.get(f"{BASE}/{session['id']}").json()["receivedParts"] == [0, 1]
        for index in (2, 3):
            assert put_part(client, session, index, data).status_code == 200
        complete_and_download(client, session, data)


def test_a_part_cut_midway_while_fed_resumes_into_the_right_object(s3_cluster):  # noqa: F811
    writer = s3_cluster.writer().wait_ready()
    data = os.urandom(4 * MiB + 99)
    with writer.client(timeout=120) as client:
        assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
        session = create(client, data, MiB)
        assert put_part(client, session, 0, data).status_code == 200
        send_half_a_part(writer.port, session, 1, data[MiB:2 * MiB])
        deadline = time.monotonic() + 10
        while True:  # the cut request lets go of its part
            answer = put_part(client, session, 1, data)
            if answer.status_code != 409 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert answer.status_code == 200, answer.text
        for index in range(2, session["partCount"]):
            assert put_part(client, session, index, data).status_code == 200
        complete_and_download(client, session, data)


def test_a_store_that_does_not_answer_never_holds_up_the_parts(s3_cluster, seaweedfs):  # noqa: F811
    """Part 0 waits at most a moment for its publication to open (a stopped store would hold
    the HEAD until obstore's request timeout): the parts land on local disk, and complete
    publishes from the file once the store is back."""
    writer = s3_cluster.writer().wait_ready()
    data = os.urandom(3 * MiB + 5)
    with writer.client(timeout=60) as client:
        assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
        session = create(client, data, MiB)
        os.kill(seaweedfs.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            for index in range(session["partCount"]):
                assert put_part(client, session, index, data).status_code == 200
            assert time.monotonic() - started < 20
        finally:
            os.kill(seaweedfs.pid, signal.SIGCONT)
        writer.wait_ready(timeout=30)
        complete_and_download(client, session, data)
