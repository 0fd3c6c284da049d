"""AWS Signature Version 4 headers for a body-less S3 request, with the standard library alone.

The local SeaweedFS (seaweedfs.py) makes and drops its buckets through its S3 port with the admin
identity, as any S3 client would: its filer's HTTP API, which did it before, is off. Only what
those requests need: no body, no query string, a path of unreserved characters.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import re

_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9._~/-]*")


def signed_headers(
    method: str,
    host: str,
    path: str,
    *,
    region: str,
    access_key_id: str,
    secret_access_key: str,
    now: datetime.datetime,
) -> dict[str, str]:
    """The headers that sign `method host path` (no body, no query) for service s3 at `now`."""
    if not _PLAIN_PATH.fullmatch(path):
        raise ValueError(f"path: expected / and unreserved characters only, got {path!r}")
    stamp = now.astimezone(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    scope = f"{stamp[:8]}/{region}/s3/aws4_request"
    names = "host;x-amz-content-sha256;x-amz-date"
    canonical = "\n".join([
        method, path, "",
        f"host:{host}", f"x-amz-content-sha256:{_EMPTY_SHA256}", f"x-amz-date:{stamp}", "",
        names, _EMPTY_SHA256,
    ])
    to_sign = "\n".join([
        "AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()
    ])
    key = ("AWS4" + secret_access_key).encode()
    for part in (stamp[:8], region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return {
        "Authorization": (
            f"AWS4-HMAC-SHA256 Credential={access_key_id}/{scope}, SignedHeaders={names},"
            f" Signature={signature}"
        ),
        "x-amz-content-sha256": _EMPTY_SHA256,
        "x-amz-date": stamp,
    }
