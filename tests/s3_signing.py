"""A small AWS SigV4 signer for the S3 calls the integration tests make.

``sign_headers`` signs one request; ``canonical_target`` is the request target to send for the
same path and query (exactly what was signed). Standard library only.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import urllib.parse
from collections.abc import Mapping

DEFAULT_REGION = "us-east-1"

# Headers never included in a signature (hop-by-hop or rewritten by HTTP stacks).
_UNSIGNED_HEADERS = frozenset(
    {"expect", "connection", "user-agent", "content-length", "transfer-encoding", "accept-encoding"}
)


def _canonical_query(query: Mapping[str, str]) -> str:
    pairs = sorted(
        (urllib.parse.quote(k, safe="~"), urllib.parse.quote(v, safe="~")) for k, v in query.items()
    )
    return "&".join(f"{k}={v}" for k, v in pairs)


def canonical_target(path: str, query: Mapping[str, str] | None = None) -> str:
    """The request target to send for an unencoded ``path`` (e.g. ``/bucket/some key``) and
    query; it is exactly what ``sign_headers`` signs."""
    target = urllib.parse.quote(path, safe="/~")
    if query:
        target += "?" + _canonical_query(query)
    return target


def sign_headers(
    method: str,
    host: str,
    path: str,
    *,
    access_key_id: str,
    secret_access_key: str,
    region: str = DEFAULT_REGION,
    query: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
    body: bytes = b"",
    payload_hash: str | None = None,
    now: datetime.datetime | None = None,
) -> dict[str, str]:
    """Returns ``headers`` plus ``Host``, ``x-amz-date``, ``x-amz-content-sha256`` and the SigV4
    ``Authorization`` header for an S3 request. ``host`` is the Host header value
    (``127.0.0.1:PORT``), ``path`` the unencoded path. Send the request to
    ``canonical_target(path, query)``. ``payload_hash="UNSIGNED-PAYLOAD"`` skips hashing."""
    stamp = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y%m%dT%H%M%SZ")
    date = stamp[:8]
    content_hash = payload_hash or hashlib.sha256(body).hexdigest()
    out = {k: str(v) for k, v in (headers or {}).items()}
    out["Host"] = host
    out["x-amz-date"] = stamp
    out["x-amz-content-sha256"] = content_hash
    signed = {
        k.lower(): " ".join(v.strip().split())
        for k, v in out.items()
        if k.lower() not in _UNSIGNED_HEADERS
    }
    names = sorted(signed)
    canonical_request = "\n".join(
        [
            method,
            urllib.parse.quote(path, safe="/~"),
            _canonical_query(query or {}),
            "".join(f"{name}:{signed[name]}\n" for name in names),
            ";".join(names),
            content_hash,
        ]
    )
    scope = f"{date}/{region}/s3/aws4_request"
    string_to_sign = "\n".join(
        [
            "AWS4-HMAC-SHA256",
            stamp,
            scope,
            hashlib.sha256(canonical_request.encode()).hexdigest(),
        ]
    )
    key = ("AWS4" + secret_access_key).encode()
    for part in (date, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()
    out["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key_id}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return out
