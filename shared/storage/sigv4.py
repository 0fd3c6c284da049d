"""S3 requests signed with AWS Signature Version 4, body-less, with the standard library alone.

For the requests obstore does not make: the object-store backend's listing and aborting of
incomplete multipart uploads (s3_multipart.py), and the local SeaweedFS's bucket creation and
readiness reads with its admin identity (shared/cli/seaweedfs.py). Only what those requests
need: no body, no chunked signing, an endpoint without a path, static keys (with a session
token when there is one). The caller sends the request; this only builds it.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import urllib.parse
import urllib.request
from collections.abc import Mapping

_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def _encode(text: str, safe: str) -> str:
    """RFC 3986 percent-encoding of all but the unreserved characters (and `safe`), as SigV4's
    canonical request wants it and as the request is sent: both must agree."""
    return urllib.parse.quote(text, safe=safe)


def signed_request(
    method: str,
    endpoint_url: str,
    path: str,
    *,
    query: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
    region: str,
    access_key_id: str,
    secret_access_key: str,
    session_token: str | None = None,
    now: datetime.datetime,
) -> urllib.request.Request:
    """`method` of `path` ("/bucket/key", not yet encoded) with `query` at `endpoint_url`
    ("http://host:port"), signed for service s3 at `now`; `headers` are sent unsigned. A
    `session_token` (temporary credentials) is sent and signed as X-Amz-Security-Token."""
    host = urllib.parse.urlsplit(endpoint_url).netloc
    canonical_path = _encode(path, safe="/")
    canonical_query = "&".join(
        f"{_encode(name, safe='')}={_encode(value, safe='')}"
        for name, value in sorted((query or {}).items())
    )
    stamp = now.astimezone(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    scope = f"{stamp[:8]}/{region}/s3/aws4_request"
    signed = {"host": host, "x-amz-content-sha256": _EMPTY_SHA256, "x-amz-date": stamp}
    if session_token:
        signed["x-amz-security-token"] = session_token
    names = ";".join(sorted(signed))
    canonical = "\n".join([
        method, canonical_path, canonical_query,
        *(f"{name}:{signed[name]}" for name in sorted(signed)), "",
        names, _EMPTY_SHA256,
    ])
    to_sign = "\n".join([
        "AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()
    ])
    key = ("AWS4" + secret_access_key).encode()
    for part in (stamp[:8], region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    sent = {name: value for name, value in signed.items() if name != "host"}  # urllib sends Host
    sent["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key_id}/{scope}, SignedHeaders={names},"
        f" Signature={signature}"
    )
    url = endpoint_url + canonical_path + (f"?{canonical_query}" if canonical_query else "")
    return urllib.request.Request(url, method=method, headers={**(headers or {}), **sent})
