"""One rule for checking an object against what a manifest, descriptor or index claims of it:
HEAD, then its size, then its etag (SPEC section 4).

The etag is compared only where both the store and the claim have one, without the quotes or
weak marker some stores add; a ``file://`` object's etag (inode and mtime) is never held
against a claim, since it does not survive a copy. Each caller words the mismatch itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from syvain_training_data.storage import ObjectInfo, StorageConfig, head_object
from syvain_training_data.uris import plain_etag, portable_etag

__all__ = ["HeadCheck", "Mismatch", "check_head", "is_sha256_hex"]

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def is_sha256_hex(value: object) -> bool:
    """True for a str of 64 lowercase hex digits, the one spelling of a claimed sha256."""
    return type(value) is str and _SHA256_HEX.fullmatch(value) is not None


@dataclass(frozen=True)
class Mismatch:
    """The first field in which the object differs from the claim."""

    field: Literal["size", "etag"]
    found: int | str  # what the store has
    expected: int | str  # what was claimed (the etag as the claim spells it)


@dataclass(frozen=True)
class HeadCheck:
    """What HEAD found, the first mismatch (None: none), and whether the etags were compared
    (False: one side had none, so the size is all HEAD could check)."""

    info: ObjectInfo
    mismatch: Mismatch | None
    etag_compared: bool


def check_head(
    uri: str,
    storage_config: StorageConfig,
    *,
    size: int | None = None,
    etag: str | None = None,
) -> HeadCheck:
    """HEADs ``uri`` and compares its size with ``size`` (None: no claim), then its etag with
    ``etag`` (None or ``""``: no claim).

    Raises FileNotFoundError when there is no object, and the store's other errors unchanged.
    """
    info = head_object(uri, storage_config=storage_config)
    if size is not None and info.size != size:
        return HeadCheck(info, Mismatch("size", info.size, size), etag_compared=False)
    claimed = portable_etag(uri, etag or "")
    if not (claimed and info.etag):
        return HeadCheck(info, None, etag_compared=False)
    if plain_etag(info.etag) != plain_etag(claimed):
        return HeadCheck(info, Mismatch("etag", info.etag, claimed), etag_compared=True)
    return HeadCheck(info, None, etag_compared=True)
