"""Issue 13 item 16 (JSON part): a JSON request body with a key twice in one object is refused
with 400 `invalid_input` on every JSON route, at any depth. Parsers disagree on which of two
values wins (Python's json the last, others the first), so a body whose meaning depends on the
parser is not accepted at all."""

from __future__ import annotations

import pytest

from arkvory.shared.errors import InvalidInput
from arkvory.shared.http.bodies import parse_json_object

from .harness import ADMIN_TOKEN

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "body",
    [
        b'{"name": "a", "name": "b"}',
        b'{"kind": "cleanup", "params": {"grace_seconds": 1, "grace_seconds": 2}}',
        b'{"a": [{"b": {"c": 1, "c": 1}}]}',  # deep inside, and the same value twice too
        b'{"name": "a", "\\u006eame": "b"}',  # the same key once decoded
    ],
)
def test_a_key_twice_in_one_object_is_refused(body):
    with pytest.raises(InvalidInput, match="twice"):
        parse_json_object(body)


def test_the_same_key_in_different_objects_is_fine():
    body = b'{"a": {"a": 1}, "b": [{"a": 1}, {"a": 2}], "c": {"b": {"a": null}}}'
    assert parse_json_object(body) == {"a": {"a": 1}, "b": [{"a": 1}, {"a": 2}], "c": {"b": {"a": None}}}


def test_the_refusal_names_the_key_but_not_at_any_length():
    with pytest.raises(InvalidInput) as refused:
        parse_json_object(b'{"' + b"k" * 10_000 + b'": 1, "' + b"k" * 10_000 + b'": 2}')
    assert len(str(refused.value)) < 200


DUPLICATES = [
    ("POST", "/api/v1/repositories", b'{"name": "one", "name": "two"}'),
    ("PATCH", "/api/v1/repositories/priv", b'{"public": false, "public": true}'),
    ("PUT", "/api/v1/repositories/priv/packages", b'{"group": "g", "group": "h", "name": "n"}'),
    ("POST", "/api/v1/tasks", b'{"kind": "cleanup", "params": {"grace_seconds": 5, "grace_seconds": 6}}'),
    ("POST", "/api/v1/keys", b'{"scopes": ["read:*"], "scopes": ["admin"]}'),
    ("POST", "/api/v1/repositories/priv/uploads", b'{"name": "f.bin", "size": 1, "size": 2}'),
    ("POST", "/api/v1/login", b'{"name": "root", "password": "x", "password": "y"}'),
]


def test_every_json_route_refuses_a_duplicate_key_with_400(cluster):
    writer = cluster.writer().wait_ready()
    with writer.client(ADMIN_TOKEN) as client:
        assert client.post("/api/v1/repositories", json={"name": "priv"}).status_code == 201
        for number, (method, path, body) in enumerate(DUPLICATES):
            headers = {"Content-Type": "application/json", "Idempotency-Key": f"dup-{number}"}
            answer = client.request(method, path, content=body, headers=headers)
            assert answer.status_code == 400, (path, answer.text)
            assert answer.json()["code"] == "invalid_input", (path, answer.text)
            assert "twice" in answer.json()["message"], (path, answer.text)
        # Nothing was made from the first value or the last.
        names = [repo["name"] for repo in client.get("/api/v1/repositories").json()["items"]]
        assert names == ["priv"]
        assert client.get("/api/v1/repositories/priv").json()["public"] is False
