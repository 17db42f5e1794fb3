"""The publication's fixed layout (SPEC section 7): where its data manifest lives, its splits,
sources and pair roles, and the two value rules every layer of the chain uses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

__all__ = [
    "ARTIFACT_MANIFEST_NAME",
    "MANIFEST_URI_PATTERN",
    "PAIR_ROLES",
    "SOURCES",
    "SPLITS",
    "is_count",
    "publication_prefix",
]

SPLITS: Final = ("basis_fit", "analysis", "validation")
SOURCES: Final = ("common_pile", "broad_replay", "dolmino", "longmino")
#: A pair's tensor role -> the role of its metadata object.
PAIR_ROLES: Final[Mapping[str, str]] = {
    "prepared_blocks": "prepared_metadata",
    "representations": "representation_metadata",
    "qkv_relations": "qkv_metadata",
}
MANIFEST_URI_PATTERN: Final = re.compile(
    r"s3://syvain-data/shared-data/distill-olmo3-representation-v1/"
    r"(?P<recipe>[0-9a-f]{64})/publication-v2/data-manifest-v1\.json"
)
ARTIFACT_MANIFEST_NAME: Final = "artifact-manifest-v2.json"


def is_count(value: object) -> bool:
    """True for an int (not a bool): JSON and Arrow counts must be integers."""
    return type(value) is int


def publication_prefix(manifest_uri: str) -> tuple[str, str]:
    """(recipe_sha256, prefix) of a canonical manifest URI; ValueError for any other URI."""
    match = MANIFEST_URI_PATTERN.fullmatch(manifest_uri)
    if match is None:
        raise ValueError(
            "manifest_uri must be s3://syvain-data/shared-data/distill-olmo3-representation-v1/"
            "{recipe_sha256}/publication-v2/data-manifest-v1.json with a lowercase hex "
            f"recipe_sha256, got {manifest_uri!r}"
        )
    return match["recipe"], manifest_uri[: -len("data-manifest-v1.json")]
