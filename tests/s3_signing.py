"""A small AWS SigV4 signer for the S3 calls the integration tests make, and its check.

``sign_headers`` signs one request; ``canonical_target`` is the request target to send for the
same path and query (exactly what was signed). ``expected_signature`` recomputes the signature
of a received request with a secret key, so a fake server can verify who signed it. Standard
library only.
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
    signature = _signature(secret_access_key, stamp, scope, canonical_request)
    out["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key_id}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return out


def _signature(secret_access_key: str, stamp: str, scope: str, canonical_request: str) -> str:
    """The SigV4 signature of ``canonical_request`` at ``stamp`` in ``scope``
    (date/region/service/aws4_request)."""
    string_to_sign = "\n".join(
        [
            "AWS4-HMAC-SHA256",
            stamp,
            scope,
            hashlib.sha256(canonical_request.encode()).hexdigest(),
        ]
    )
    key = ("AWS4" + secret_access_key).encode()
    for part in scope.split("/"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()


def authorization_fields(authorization: str) -> dict[str, str]:
    """The fields of a SigV4 ``Authorization`` header: Credential (key/scope), SignedHeaders
    and Signature; ValueError for another scheme."""
    scheme, _, rest = authorization.partition(" ")
    if scheme != "AWS4-HMAC-SHA256":
        raise ValueError(f"not a SigV4 authorization: {scheme!r}")
    fields = dict(part.strip().split("=", 1) for part in rest.split(","))
    return {name: fields[name] for name in ("Credential", "SignedHeaders", "Signature")}


def expected_signature(
    method: str, target: str, headers: Mapping[str, str], secret_access_key: str
) -> str:
    """The signature a request of ``method`` to ``target`` (as received: encoded path and
    query) with ``headers`` (lower-case names) should carry when signed with
    ``secret_access_key``, over the headers its ``Authorization`` names as signed."""
    fields = authorization_fields(headers["authorization"])
    scope = fields["Credential"].split("/", 1)[1]
    path, _, query = target.partition("?")
    pairs = []
    for piece in query.split("&") if query else []:
        name, _, value = piece.partition("=")
        pairs.append((urllib.parse.unquote(name), urllib.parse.unquote(value)))
    names = fields["SignedHeaders"].split(";")
    canonical_request = "\n".join(
        [
            method,
            path,
            _canonical_query(dict(pairs)),
            "".join(f"{name}:{' '.join(headers[name].strip().split())}\n" for name in names),
            ";".join(names),
            headers["x-amz-content-sha256"],
        ]
    )
    return _signature(secret_access_key, headers["x-amz-date"], scope, canonical_request)
