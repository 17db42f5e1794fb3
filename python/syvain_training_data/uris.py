"""The URIs of SPEC section 4: parsing, the untrusted-manifest scheme rule, and etags.

A URI is ``s3://bucket/key``, ``gs://bucket/key`` (read-only for now), ``file:///absolute/path``,
``https://host[:port]/path`` or ``hf://datasets/owner/name[@revision]/path`` (read-only), and
``http://host[:port]/path`` (read-only, read only where the caller passes ``allow_http=True``:
the URI is valid, the store refuses it otherwise); schemes are lower case,
and ``file:/path`` and ``file://host/path`` are not URIs here. An https:// URI holds no user
info, query or fragment: a request goes only where the URI says. These are the rules of the
Rust side (``Location::parse`` in ``rust/core/src/object_stores.rs``), which reads every
object: a URI valid here is one the store accepts. ``tests/uri_rules.json`` is one table of
valid and invalid URIs that both sides are tested against.

- **Bucket names** hold only ASCII letters, digits, ``.``, ``-`` and ``_``: no character that
  could change a request's URL or host (``/ ? # @ : %``, whitespace, control characters), in
  path and virtual-hosted style alike.
- **Keys** (and a file path after its root slash) are non-empty, do not end in ``/``, and hold
  no empty, ``.`` or ``..`` segment and no ASCII control character. A key is taken literally:
  ``a//b`` or ``a/../b`` would name another object on the local store (or a file outside a
  dataset's folder), so they are refused rather than normalized.
- **Schemes are confined** (:func:`check_shard_scheme`): a manifest read from ``s3://`` may name
  only ``s3://`` shards and a ``file://`` manifest only ``file://`` shards, an ``https://`` or
  ``hf://`` manifest (or ``http://``) only shards of its own scheme on its own host, unless the
  caller opts in
  with ``allow_mixed_schemes=True``. A manifest can never point a reader at local files it was
  not loaded from, nor a manifest from the web at another host (an internal address).
- **Etags of file://, https:// and hf:// objects** are never recorded nor enforced from a
  manifest (:func:`portable_etag`): a local dataset copied with cp, rsync or a restore, or a
  dataset mirrored to a web server (whose etags are its own), stays valid; size and, for
  descriptors, sha256 guard it, and a read is held to the etag its first response gave. S3
  etags are compared without the quotes and weak marker some stores add (:func:`plain_etag`).
"""

from __future__ import annotations

import re
from typing import Final, Literal
from urllib.parse import urlsplit

__all__ = [
    "FILE_PREFIX",
    "GS_PREFIX",
    "HTTPS_PREFIX",
    "HTTP_PREFIX",
    "HUB_PREFIX",
    "S3_PREFIX",
    "Scheme",
    "bucket_key",
    "check_bucket_name",
    "check_shard_scheme",
    "check_uri",
    "file_path",
    "host_of",
    "hub_path",
    "https_host_path",
    "plain_etag",
    "portable_etag",
    "s3_bucket_key",
    "scheme_of",
]

S3_PREFIX: Final = "s3://"
GS_PREFIX: Final = "gs://"
FILE_PREFIX: Final = "file://"
HTTPS_PREFIX: Final = "https://"
HTTP_PREFIX: Final = "http://"
HUB_PREFIX: Final = "hf://"
_WEB_PREFIXES: Final = (HTTPS_PREFIX, HTTP_PREFIX)

type Scheme = Literal["s3", "gs", "file", "https", "http", "hf"]

# hf://datasets/owner/name[@revision]/path: the Hub's repository names.
_HUB_URI: Final = re.compile(
    r"hf://datasets/(?P<owner>[A-Za-z0-9._-]+)/(?P<name>[A-Za-z0-9._-]+)"
    r"(?:@(?P<revision>[A-Za-z0-9._-]+))?/(?P<path>.+)"
)

# / ? # @ : % change a URL's path, query, fragment, user info, port or escapes; whitespace and
# control characters (C0, DEL, C1) end or split a request line.
_BAD_BUCKET_CHARACTER: Final = re.compile(r"[/?#@:%\s\x00-\x1f\x7f-\x9f]")
# Anything else a bucket name never holds.
_NOT_A_BUCKET_CHARACTER: Final = re.compile(r"[^A-Za-z0-9._-]")
_KEY_CONTROL_CHARACTER: Final = re.compile(r"[\x00-\x1f\x7f]")


def check_bucket_name(bucket: str) -> str:
    """Returns ``bucket``; ValueError if it is empty or holds a character other than ASCII
    letters, digits, ``.``, ``-`` and ``_``."""
    if not bucket:
        raise ValueError("bucket name is empty")
    _refuse_request_changing_characters(bucket)
    problem = _bucket_problem(bucket)
    if problem:
        raise ValueError(problem)
    return bucket


def _refuse_request_changing_characters(bucket: str) -> None:
    """ValueError naming the characters SPEC section 4 forbids (those that could change where
    a request goes); the other characters a bucket never holds get :func:`_bucket_problem`."""
    found = _BAD_BUCKET_CHARACTER.search(bucket)
    if found:
        raise ValueError(
            f"bucket name {bucket!r} holds {found.group()!r}: a bucket name may not hold "
            "/ ? # @ : %, whitespace or control characters"
        )


def _bucket_problem(bucket: str) -> str | None:
    found = _NOT_A_BUCKET_CHARACTER.search(bucket)
    if found is None:
        return None
    return (
        f"the bucket name {bucket!r} holds {found.group()!r}; bucket names may hold only "
        "letters, digits, '.', '-' and '_'"
    )


def _key_problem(key: str, what: str = "key") -> str | None:
    """What makes a non-empty key (or a path after its root slash) name no single object."""
    if key.endswith("/"):
        return f"an object {what} may not end in '/'"
    if any(segment in ("", ".", "..") for segment in key.split("/")):
        return f"the {what} holds an empty, '.' or '..' segment"
    if _KEY_CONTROL_CHARACTER.search(key):
        return f"the {what} holds a control character"
    return None


def s3_bucket_key(uri: str) -> tuple[str, str]:
    """``(bucket, key)`` of ``s3://bucket/key``; ValueError unless both are non-empty and valid
    (:func:`check_bucket_name`, the key rules of the module docstring)."""
    return bucket_key(uri, S3_PREFIX)


def bucket_key(uri: str, prefix: str) -> tuple[str, str]:
    """``(bucket, key)`` of ``{prefix}bucket/key`` (``s3://`` or ``gs://``, with one rule for
    buckets and keys); ValueError unless both are non-empty and valid."""
    if uri.startswith(prefix):
        bucket, slash, key = uri[len(prefix) :].partition("/")
        if bucket and slash and key:
            _refuse_request_changing_characters(bucket)
            problem = _bucket_problem(bucket) or _key_problem(key)
            if problem:
                raise ValueError(f"{uri!r} is not a valid object URI: {problem}")
            return bucket, key
    raise ValueError(f"{uri!r} is not a {prefix}bucket/key URI (bucket and key non-empty)")


def file_path(uri: str) -> str:
    """The absolute path of ``file:///absolute/path``; ValueError otherwise."""
    if uri.startswith(FILE_PREFIX + "/") and len(uri) > len(FILE_PREFIX) + 1:
        path = uri[len(FILE_PREFIX) :]
        problem = _key_problem(path[1:], "path")
        if problem:
            raise ValueError(f"{uri!r} is not a valid file:///absolute/path URI: {problem}")
        return path
    raise ValueError(f"{uri!r} is not a file:///absolute/path URI")


def https_host_path(uri: str) -> tuple[str, str]:
    """``(host[:port], path)`` of ``https://host[:port]/path`` (or ``http://``); ValueError
    unless the host is present, the path is a valid key, and there is no user info, query or
    fragment."""
    if "\\" in uri:  # read as a slash by URL parsers: the host could be another
        raise ValueError(f"{uri!r} is not a valid object URI: a backslash is not allowed")
    parts = urlsplit(uri)
    prefix = f"{parts.scheme}://"
    if prefix not in _WEB_PREFIXES or not uri.startswith(prefix) or not parts.hostname:
        raise ValueError(f"{uri!r} is not an https://host/path URI")
    if "@" in parts.netloc:
        raise ValueError(f"{uri!r} is not a valid object URI: user info is not allowed")
    if parts.query or parts.fragment or "?" in uri or "#" in uri:
        raise ValueError(f"{uri!r} is not a valid object URI: a query or fragment is not allowed")
    path = uri[len(prefix) :].partition("/")[2]
    problem = _key_problem(path, "path") if path else "the path is empty"
    if problem:
        raise ValueError(f"{uri!r} is not a valid object URI: {problem}")
    try:
        parts.port  # noqa: B018 - a port that is not a number is a ValueError
    except ValueError as error:
        raise ValueError(f"{uri!r} is not a valid object URI: {error}") from None
    return parts.netloc, path


def hub_path(uri: str) -> str:
    """The path inside its repository of ``hf://datasets/owner/name[@revision]/path``;
    ValueError otherwise."""
    found = _HUB_URI.fullmatch(uri)
    if found is None or any(
        part in (".", "..") for part in (found["owner"], found["name"], found["revision"])
    ):
        raise ValueError(f"{uri!r} is not an hf://datasets/owner/name@revision/path URI")
    problem = _key_problem(found["path"], "path")
    if problem:
        raise ValueError(f"{uri!r} is not a valid object URI: {problem}")
    return found["path"]


def check_uri(uri: str) -> str:
    """Returns ``uri`` if it is ``s3://bucket/key``, ``file:///absolute/path``,
    ``https://host/path`` or ``hf://datasets/owner/name@revision/path``; else a ValueError
    saying what is wrong."""
    if uri.startswith((S3_PREFIX, GS_PREFIX)):
        bucket_key(uri, uri[: uri.index("://") + 3])
    elif uri.startswith(FILE_PREFIX):
        file_path(uri)
    elif uri.startswith(_WEB_PREFIXES):
        https_host_path(uri)
    elif uri.startswith(HUB_PREFIX):
        hub_path(uri)
    else:
        raise ValueError(
            f"{uri!r} is none of s3://bucket/key, gs://bucket/key, file:///absolute/path, "
            "https://host/path (http:// with allow_http) and "
            "hf://datasets/owner/name@revision/path"
        )
    return uri


def scheme_of(uri: str) -> Scheme:
    """``"s3"``, ``"gs"``, ``"file"``, ``"https"``, ``"http"`` or ``"hf"``; ValueError for any
    other."""
    schemes: tuple[Scheme, ...] = ("s3", "gs", "file", "https", "http", "hf")
    for scheme in schemes:
        if uri.startswith(f"{scheme}://"):
            return scheme
    raise ValueError(
        f"{uri!r} is none of an s3://, gs://, file://, https://, http:// and hf:// URI"
    )


def host_of(uri: str) -> str:
    """Where a request for ``uri`` goes, for the untrusted-manifest rule: the bucket of an s3://
    URI is not a host (every bucket of the client's endpoint is alike), so ``""`` for s3://,
    gs://, file:// and hf:// (the Hub), ``host[:port]`` for https:// and http://."""
    return https_host_path(uri)[0].lower() if uri.startswith(_WEB_PREFIXES) else ""


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
    if host_of(manifest_uri) != host_of(shard_uri):
        raise ValueError(
            f"Manifest {manifest_uri} names shard {shard_uri}, but a manifest read from "
            f"{manifest_scheme}://{host_of(manifest_uri)} may name only shards on that host (pass "
            "allow_mixed_schemes=True to read a manifest you trust that names other hosts)"
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
    a copy, even where an older manifest or descriptor recorded one, and for an https:// or
    hf:// object, whose server's etags are its own (a mirror's differ from the publisher's);
    ``etag`` otherwise."""
    return "" if uri.startswith((FILE_PREFIX, HUB_PREFIX, *_WEB_PREFIXES)) else etag
