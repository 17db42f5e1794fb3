"""Completion descriptors (SPEC section 5): their canonical bytes, and the checks a descriptor
found in the store must pass before its shard is published."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import TypeAdapter, ValidationError

from syvain_training_data.errors import PublicationConflictError
from syvain_training_data.manifest import JsonObject, ManifestShard
from syvain_training_data.object_check import is_sha256_hex
from syvain_training_data.strict_json import loads_strict_json

__all__ = [
    "DESCRIPTOR_SCHEMA",
    "Described",
    "ShardEntry",
    "canonical_json",
    "descriptor_bytes",
    "loads_descriptor",
    "parse_descriptor",
    "validate_metadata",
]

DESCRIPTOR_SCHEMA: Final = "syvain-training-data-shard-v1"
_DESCRIPTOR_KEYS: Final = frozenset(
    {"curriculum_metadata", "curriculum_stage", "data_format", "schema", "sha256", "shard", "split"}
)
_SHARD_KEYS: Final = frozenset({"etag", "records", "size_bytes", "uri"})
_metadata_adapter: TypeAdapter[dict[str, Any]] = TypeAdapter(JsonObject)


def canonical_json(value: object) -> str:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def descriptor_bytes(
    *,
    shard: ManifestShard,
    data_format: str,
    split: str,
    curriculum_stage: str | None,
    curriculum_metadata: Mapping[str, Any] | None,
    sha256: str,
) -> bytes:
    """The completion descriptor of SPEC section 5: sorted keys, separators ``(",", ":")``,
    ASCII-escaped, plus ``"\\n"``."""
    document = {
        "curriculum_metadata": curriculum_metadata,
        "curriculum_stage": curriculum_stage,
        "data_format": data_format,
        "schema": DESCRIPTOR_SCHEMA,
        "sha256": sha256,
        "shard": {
            "etag": shard.etag,
            "records": shard.records,
            "size_bytes": shard.size_bytes,
            "uri": shard.uri,
        },
        "split": split,
    }
    return (canonical_json(document) + "\n").encode("ascii")


def validate_metadata(metadata: object) -> str | None:
    """Canonical JSON text of the metadata (None stays None); ValueError if not a JSON object."""
    if metadata is None:
        return None
    try:
        validated = _metadata_adapter.validate_python(metadata, strict=True)
    except ValidationError as error:
        raise ValueError(f"curriculum_metadata must be a JSON object: {error}") from error
    return canonical_json(validated)


def loads_descriptor(data: bytes, uri: str) -> Any:
    """The JSON value of a descriptor's bytes; PublicationConflictError if they are not ASCII
    JSON, strict as a manifest's (no NaN or Infinity, no repeated key)."""
    try:
        return loads_strict_json(data.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise PublicationConflictError(
            f"Completion descriptor {uri} is not valid ASCII JSON: {error}"
        ) from error


@dataclass(frozen=True)
class ShardEntry:
    """A shard and its place in a manifest: split, curriculum stage and the stage's metadata."""

    split: str
    stage: str | None
    metadata: str | None  # canonical JSON text of the curriculum metadata
    shard: ManifestShard


@dataclass(frozen=True)
class Described(ShardEntry):
    """What a valid descriptor says: its shard, where it belongs and the data's sha256."""

    sha256: str


def conflict(descriptor_uri: str, reason: str) -> PublicationConflictError:
    return PublicationConflictError(f"Completion descriptor {descriptor_uri}: {reason}")


def parse_descriptor(data: bytes, descriptor_uri: str, data_format: str) -> Described:
    """The content of a descriptor whose bytes are exactly the canonical bytes of a valid
    descriptor of ``data_format``; PublicationConflictError naming the first rule it breaks."""
    document = loads_descriptor(data, descriptor_uri)
    if not isinstance(document, dict) or set(document) != _DESCRIPTOR_KEYS:
        raise conflict(descriptor_uri, f"expected exactly the keys {sorted(_DESCRIPTOR_KEYS)}")
    if document["schema"] != DESCRIPTOR_SCHEMA:
        raise conflict(
            descriptor_uri, f"schema is {document['schema']!r}, expected {DESCRIPTOR_SCHEMA!r}"
        )
    digest = document["sha256"]
    if not is_sha256_hex(digest):
        raise conflict(descriptor_uri, "sha256 is not 64 lowercase hex digits")
    if document["data_format"] != data_format:
        raise conflict(
            descriptor_uri, f"data_format is {document['data_format']!r}, not {data_format!r}"
        )
    split, stage = document["split"], document["curriculum_stage"]
    if not isinstance(split, str) or not (stage is None or isinstance(stage, str)):
        raise conflict(
            descriptor_uri, "split must be a string and curriculum_stage a string or null"
        )
    try:
        metadata = validate_metadata(document["curriculum_metadata"])
    except ValueError as error:
        raise conflict(descriptor_uri, str(error)) from None
    if metadata is not None and stage is None:
        raise conflict(descriptor_uri, "curriculum_metadata without a curriculum_stage")
    described = document["shard"]
    if not isinstance(described, dict) or set(described) != _SHARD_KEYS:
        raise conflict(descriptor_uri, f"shard must have exactly the keys {sorted(_SHARD_KEYS)}")
    try:
        shard = ManifestShard.model_validate(described, strict=True)
    except ValidationError as error:
        raise conflict(descriptor_uri, f"invalid shard: {error}") from None
    return Described(split, stage, metadata, shard, digest)


def check_canonical(data: bytes, descriptor_uri: str, data_format: str, found: Described) -> None:
    """PublicationConflictError unless ``data`` are the canonical bytes of ``found``."""
    canonical = descriptor_bytes(
        shard=found.shard,
        data_format=data_format,
        split=found.split,
        curriculum_stage=found.stage,
        curriculum_metadata=None if found.metadata is None else json.loads(found.metadata),
        sha256=found.sha256,
    )
    if canonical != data:
        raise conflict(descriptor_uri, "its bytes are not the canonical descriptor bytes")
