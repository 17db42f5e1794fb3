"""The URIs of SPEC section 4: parsing, the untrusted-manifest scheme rule, and etags.

A URI is ``s3://bucket/key`` (bucket and key non-empty) or ``file:///absolute/path``
(something must follow the root slash). Schemes are lower case; ``file:/path`` and
``file://host/path`` are not URIs here.

- **Bucket names** may not hold a character that could change a request's URL or host:
  ``/ ? # @ : %``, whitespace or control characters (in path and virtual-hosted style alike).
- **Schemes are confined** (:func:`check_shard_scheme`): a manifest read from ``s3://`` may name
  only ``s3://`` shards and a ``file://`` manifest only ``file://`` shards, unless the caller
  opts in with ``allow_mixed_schemes=True``. A manifest can never point a reader at local files
  it was not loaded from.
- **Etags of file:// objects** (inode and mtime) are never recorded nor enforced
  (:func:`portable_etag`): a local dataset copied with cp, rsync or a
  restore stays valid; size and, for descriptors, sha256 guard it. S3 etags are compared
  without the quotes and weak marker some stores add (:func:`plain_etag`).
"""

from __future__ import annotations

import re
from typing import Final, Literal

__all__ = [
    "FILE_PREFIX",
    "S3_PREFIX",
    "Scheme",
    "check_bucket_name",
    "check_shard_scheme",
    "check_uri",
    "file_path",
    "plain_etag",
    "portable_etag",
    "s3_bucket_key",
    "scheme_of",
]

S3_PREFIX: Final = "s3://"
FILE_PREFIX: Final = "file://"

type Scheme = Literal["s3", "file"]

# / ? # @ : % change a URL's path, query, fragment, user info, port or escapes; whitespace and
# control characters (C0, DEL, C1) end or split a request line.
_BAD_BUCKET_CHARACTER: Final = re.compile(r"[/?#@:%\s\x00-\x1f\x7f-\x9f]")


def check_bucket_name(bucket: str) -> str:
    """Returns ``bucket``; ValueError if it is empty or holds a character that could change
    the request URL or its host."""
    if not bucket:
        raise ValueError("bucket name is empty")
    found = _BAD_BUCKET_CHARACTER.search(bucket)
    if found:
        raise ValueError(
            f"bucket name {bucket!r} holds {found.group()!r}: a bucket name may not hold "
            "/ ? # @ : %, whitespace or control characters"
        )
    return bucket


def s3_bucket_key(uri: str) -> tuple[str, str]:
    """``(bucket, key)`` of ``s3://bucket/key``; ValueError unless both are non-empty and the
    bucket name is safe (:func:`check_bucket_name`)."""
    if uri.startswith(S3_PREFIX):
        bucket, slash, key = uri[len(S3_PREFIX) :].partition("/")
        if bucket and slash and key:
            check_bucket_name(bucket)
            return bucket, key
    raise ValueError(f"{uri!r} is not an s3://bucket/key URI (bucket and key non-empty)")


def file_path(uri: str) -> str:
    """The absolute path of ``file:///absolute/path``; ValueError otherwise."""
    if uri.startswith(FILE_PREFIX + "/") and len(uri) > len(FILE_PREFIX) + 1:
        return uri[len(FILE_PREFIX) :]
    raise ValueError(f"{uri!r} is not a file:///absolute/path URI")


def check_uri(uri: str) -> str:
    """Returns ``uri`` if it is ``s3://bucket/key`` or ``file:///absolute/path``; else a
    ValueError saying what is wrong."""
    if uri.startswith(S3_PREFIX):
        s3_bucket_key(uri)
    elif uri.startswith(FILE_PREFIX):
        file_path(uri)
    else:
        raise ValueError(f"{uri!r} is neither s3://bucket/key nor file:///absolute/path")
    return uri


def scheme_of(uri: str) -> Scheme:
    """``"s3"`` or ``"file"``; ValueError for any other scheme."""
    if uri.startswith(S3_PREFIX):
        return "s3"
    if uri.startswith(FILE_PREFIX):
        return "file"
    raise ValueError(f"{uri!r} is neither an s3:// nor a file:// URI")


def check_shard_scheme(
    manifest_uri: str, shard_uri: str, *, allow_mixed_schemes: bool = False
) -> None:
    """ValueError, naming both, when a shard's scheme is not its manifest's and the caller did
    not opt in with ``allow_mixed_schemes``; call it before any request for the shard."""
    if allow_mixed_schemes:
        return
    manifest_scheme, shard_scheme = scheme_of(manifest_uri), scheme_of(shard_uri)
    if manifest_scheme != shard_scheme:
        raise ValueError(
            f"Manifest {manifest_uri} names shard {shard_uri}, but a manifest read from "
            f"{manifest_scheme}:// may name only {manifest_scheme}:// shards (pass "
            "allow_mixed_schemes=True to read a manifest you trust that mixes schemes)"
        )


def plain_etag(etag: str) -> str:
    """An etag without the quotes (and weak marker) some stores put around it."""
    etag = etag.strip()
    if etag.startswith("W/"):
        etag = etag[2:]
    return etag.strip('"')


def portable_etag(uri: str, etag: str) -> str:
    """The etag to write into a manifest or descriptor, and the only one a reader holds an
    object to: ``""`` (none) for a file:// object, whose etag (inode and mtime) does not survive
    a copy, even where an older manifest or descriptor recorded one; ``etag`` otherwise."""
    return "" if uri.startswith(FILE_PREFIX) else etag
