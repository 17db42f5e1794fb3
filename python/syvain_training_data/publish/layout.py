"""Where a saver's objects go (SPEC section 5): shard URIs, completion descriptors, session
records.

Layout (``{base}`` is the manifest's parent prefix + ``/shards``)::

    {base}/{split}/part-{uuid4 hex}{suffix}                             no shard_id
    {base}/{split}/curriculum/{stage}/part-{uuid4 hex}{suffix}
    {base}/by-manifest/{sha256 of the manifest key}/{split}/part-{shard_id}{suffix}
    {base}/by-manifest/{...}/{split}/curriculum/{stage}/part-{shard_id}{suffix}
    {shard_uri}.metadata.json                                           completion descriptor
    {base}/by-manifest/{sha}/saver-sessions/{session}/part-{uuid}{suffix}.saved.json

Each segment is stripped of surrounding whitespace, must be non-empty, and is percent-encoded
keeping only ASCII letters, digits and ``-_.=+`` (UTF-8 bytes as ``%XX``, upper-case hex).
The manifest key hashed for ``by-manifest`` is the object key: for ``s3://b/k`` it is ``k``; for
``file:///abs/path`` it is ``abs/path``.
"""

from __future__ import annotations

import functools
import hashlib
import string
import uuid
from dataclasses import dataclass
from typing import Final

from syvain_training_data.formats.registry import FORMATS
from syvain_training_data.uris import (
    GS_PREFIX,
    HTTP_PREFIX,
    HTTPS_PREFIX,
    HUB_PREFIX,
    file_path,
    s3_bucket_key,
    scheme_of,
)

__all__ = ["DESCRIPTOR_SUFFIX", "SESSION_RECORD_SUFFIX", "SUFFIXES", "Layout", "encode_segment"]

DESCRIPTOR_SUFFIX: Final = ".metadata.json"
SESSION_RECORD_SUFFIX: Final = ".saved.json"
SESSIONS_SEGMENT: Final = "saver-sessions"
SUFFIXES: Final[dict[str, str]] = {name: kind.suffix for name, kind in FORMATS.items()}
_SAFE_CHARS: Final = frozenset(string.ascii_letters + string.digits + "-_.=+")


def encode_segment(value: str, what: str = "path segment") -> str:
    """Strips ``value`` and percent-encodes it, keeping ASCII letters, digits and ``-_.=+``.

    Raises TypeError for a non-str, ValueError for an empty (after stripping), ``.`` or ``..``
    segment or one with a lone surrogate.
    """
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    stripped = value.strip()
    if not stripped:
        raise ValueError(f"{what} must be non-empty (after stripping whitespace), got {value!r}")
    try:
        encoded = "".join(
            char if char in _SAFE_CHARS else "".join(f"%{b:02X}" for b in char.encode("utf-8"))
            for char in stripped
        )
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not encodable as UTF-8: {value!r}") from None
    if encoded in (".", ".."):
        raise ValueError(f"{what} may not be {encoded!r}")
    return encoded


def manifest_key(manifest_uri: str) -> str:
    if manifest_uri.startswith((HTTPS_PREFIX, HTTP_PREFIX, HUB_PREFIX, GS_PREFIX)):
        raise ValueError(
            f"manifest_uri {manifest_uri!r}: gs://, https://, http:// and hf:// stores are "
            "read-only; "
            "publish to s3:// or file:// and copy or serve the files from there"
        )
    try:
        if scheme_of(manifest_uri) == "s3":
            return s3_bucket_key(manifest_uri)[1]
        return file_path(manifest_uri)[1:]
    except ValueError:
        raise ValueError(
            f"manifest_uri must be s3://bucket/key or file:///absolute/path, got {manifest_uri!r}"
        ) from None


@dataclass(frozen=True)
class Layout:
    """The URIs of one manifest's shards, for one data format and saver session."""

    manifest_uri: str
    data_format: str
    session_id: str

    @functools.cached_property
    def shard_base_uri(self) -> str:
        return self.manifest_uri.rsplit("/", 1)[0] + "/shards"

    @functools.cached_property
    def deterministic_base_uri(self) -> str:
        digest = hashlib.sha256(manifest_key(self.manifest_uri).encode("utf-8")).hexdigest()
        return f"{self.shard_base_uri}/by-manifest/{digest}"

    @property
    def session_prefix(self) -> str:
        return f"{self.deterministic_base_uri}/{SESSIONS_SEGMENT}/{self.session_id}/"

    def shard_uri(self, split: str, curriculum_stage: str | None, shard_id: str | None) -> str:
        """The URI a shard gets; ``shard_id=None`` draws a random id."""
        split_segment = encode_segment(split, "split")
        if shard_id is None:
            base, part = self.shard_base_uri, uuid.uuid4().hex
        else:
            base, part = self.deterministic_base_uri, encode_segment(shard_id, "shard_id")
        prefix = f"{base}/{split_segment}"
        if curriculum_stage is not None:
            prefix += f"/curriculum/{encode_segment(curriculum_stage, 'curriculum_stage')}"
        return f"{prefix}/part-{part}{SUFFIXES[self.data_format]}"

    def session_record_uri(self, shard_uri: str) -> str:
        """Where a shard saved without ``shard_id`` is recorded for this session's commit."""
        return f"{self.session_prefix}{shard_uri.rsplit('/', 1)[1]}{SESSION_RECORD_SUFFIX}"

    def places(self, uri: str, split: str, stage: str | None, deterministic: bool) -> bool:
        """Whether ``uri`` is where a shard of ``split`` and ``stage`` goes. Raises ValueError
        for names that cannot be segments."""
        base = self.deterministic_base_uri if deterministic else self.shard_base_uri
        prefix = f"{base}/{encode_segment(split, 'split')}/"
        if stage is not None:
            prefix += f"curriculum/{encode_segment(stage, 'curriculum_stage')}/"
        name = uri[len(prefix) :] if uri.startswith(prefix) else ""
        suffix = SUFFIXES[self.data_format]
        part = (
            name[len("part-") : -len(suffix)]
            if name.startswith("part-") and name.endswith(suffix)
            else ""
        )
        return bool(part) and "/" not in part
