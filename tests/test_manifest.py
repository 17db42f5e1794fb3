"""Tests for the data manifest v1 contract (SPEC section 2): canonical bytes, the models
(strict, frozen, field order), and stages as subsets of their split."""

from __future__ import annotations

import copy
import json
import pickle
from types import MappingProxyType
from typing import Any, get_args

import pytest
from pydantic import ValidationError

from manifest_helpers import (
    EXPECTED_CANONICAL,
    SHARD_A,
    SHARD_B,
    URI,
    assert_shape_error,
    encode,
    entry_of,
    shard_of,
    small_manifest,
    stage_of,
    stage_shard_of,
)
from syvain_training_data.manifest import (
    DATA_FORMATS,
    DataManifest,
    DataManifestDataFormat,
    ManifestCurriculumStage,
    ManifestDatasetEntry,
    ManifestShard,
    canonical_manifest_bytes,
    parse_manifest,
    validate_manifest,
)

# --------------------------------------------------------------------------------------------
# Canonical bytes
# --------------------------------------------------------------------------------------------


def test_canonical_bytes_match_hand_written_text() -> None:
    manifest = validate_manifest(small_manifest())
    data = canonical_manifest_bytes(manifest)
    assert data == EXPECTED_CANONICAL.encode("utf-8")
    assert data.endswith(b"}\n")
    assert "é".encode() in data  # non-ASCII kept as UTF-8, not escaped


def test_canonical_bytes_round_trip() -> None:
    manifest = validate_manifest(small_manifest())
    data = canonical_manifest_bytes(manifest)
    parsed = parse_manifest(data, URI)
    assert parsed == manifest
    assert canonical_manifest_bytes(parsed) == data


def test_parse_of_non_canonical_text_gives_canonical_bytes() -> None:
    compact = json.dumps(small_manifest(), separators=(",", ":"), ensure_ascii=True).encode()
    assert compact != EXPECTED_CANONICAL.encode()
    manifest = parse_manifest(compact, URI)
    assert canonical_manifest_bytes(manifest) == EXPECTED_CANONICAL.encode("utf-8")


def test_defaults_are_always_written() -> None:
    data = small_manifest()
    entry = data["splits"]["train"]
    del entry["curriculum"]
    entry["shards"] = [{"uri": SHARD_A, "records": 5, "size_bytes": 1}]
    manifest = validate_manifest(data)
    text = canonical_manifest_bytes(manifest).decode()
    assert '"curriculum": {}' in text
    assert '"etag": ""' in text
    stage = ManifestCurriculumStage.model_validate(
        {"records": 1, "shards": [{"uri": SHARD_A, "records": 1, "size_bytes": 1}]}
    )
    assert stage.metadata == {}
    assert '"metadata":{}' in stage.model_dump_json()


def test_canonical_bytes_keep_null_metadata_and_key_order() -> None:
    data = small_manifest()
    data["splits"] = {"z": data["splits"]["train"], "a": copy.deepcopy(data["splits"]["train"])}
    data["splits"]["z"]["curriculum"]["warmup"]["metadata"] = {"b": None, "a": {"n": None}}
    manifest = validate_manifest(data)
    text = canonical_manifest_bytes(manifest).decode()
    assert text.index('"z"') < text.index('"a": {\n      "records"')
    assert '"b": null' in text and '"n": null' in text
    assert parse_manifest(text.encode(), URI) == manifest


@pytest.mark.parametrize(
    "value",
    [1.5, -0.0, 1e100, 5e-324, 10**40, -7, "text", "", None, True, False, [], {}, [[{"a": []}]]],
    ids=lambda value: repr(value)[:20],
)
def test_metadata_values_round_trip(value: Any) -> None:
    data = small_manifest()
    data["splits"]["train"]["curriculum"]["warmup"]["metadata"] = {"v": value}
    manifest = parse_manifest(encode(data), URI)
    parsed = manifest.splits["train"].curriculum["warmup"].metadata["v"]
    assert parsed == value and type(parsed) is type(value)
    again = parse_manifest(canonical_manifest_bytes(manifest), URI)
    assert again == manifest
    assert canonical_manifest_bytes(again) == canonical_manifest_bytes(manifest)


def test_canonical_bytes_reject_non_manifest() -> None:
    with pytest.raises(TypeError):
        canonical_manifest_bytes(small_manifest())  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Models: strict, frozen, field order
# --------------------------------------------------------------------------------------------


def test_field_order_is_spec_order() -> None:
    assert list(DataManifest.model_fields) == ["version", "data_format", "splits"]
    assert list(ManifestDatasetEntry.model_fields) == ["records", "shards", "curriculum"]
    assert list(ManifestCurriculumStage.model_fields) == ["records", "shards", "metadata"]
    assert list(ManifestShard.model_fields) == ["uri", "records", "size_bytes", "etag"]


def test_data_formats() -> None:
    assert get_args(DataManifestDataFormat) == ("jsonl.gz", "parquet", "msgpack.zstf")
    assert DATA_FORMATS == ("jsonl.gz", "parquet", "msgpack.zstf")


@pytest.mark.parametrize("data_format", DATA_FORMATS)
def test_every_data_format_is_accepted(data_format: str) -> None:
    data = small_manifest()
    data["data_format"] = data_format
    assert parse_manifest(encode(data), URI).data_format == data_format


@pytest.mark.parametrize(
    ("target", "field", "value"),
    [
        ("manifest", "version", 1),
        ("manifest", "data_format", "parquet"),
        ("manifest", "splits", {}),
        ("entry", "records", 6),
        ("entry", "curriculum", {}),
        ("stage", "metadata", {}),
        ("shard", "etag", "x"),
        ("shard", "uri", SHARD_B),
    ],
    ids=lambda value: str(value)[:16],
)
def test_models_are_frozen(target: str, field: str, value: Any) -> None:
    manifest = validate_manifest(small_manifest())
    entry = manifest.splits["train"]
    stage = entry.curriculum["warmup"]
    objects = {"manifest": manifest, "entry": entry, "stage": stage, "shard": entry.shards[0]}
    with pytest.raises(ValidationError, match="frozen"):
        setattr(objects[target], field, value)


def test_models_pickle() -> None:
    manifest = validate_manifest(small_manifest())
    assert pickle.loads(pickle.dumps(manifest)) == manifest


def test_validate_manifest_accepts_any_top_level_mapping() -> None:
    manifest = validate_manifest(MappingProxyType(small_manifest()))
    assert manifest == parse_manifest(encode(small_manifest()), URI)


def test_validate_manifest_revalidates_a_model() -> None:
    manifest = validate_manifest(small_manifest())
    assert validate_manifest(manifest) == manifest
    manifest.splits["train"].shards.clear()  # inner containers are plain lists and dicts
    with pytest.raises(ValidationError, match="at least one shard"):
        validate_manifest(manifest)


def test_validate_manifest_rejects_other_types() -> None:
    with pytest.raises(TypeError):
        validate_manifest([("version", 1)])  # type: ignore[arg-type]


def test_parse_manifest_rejects_str() -> None:
    with pytest.raises(TypeError):
        parse_manifest(EXPECTED_CANONICAL, URI)  # type: ignore[arg-type]


def test_parse_manifest_accepts_bytearray() -> None:
    assert parse_manifest(bytearray(EXPECTED_CANONICAL.encode()), URI) == validate_manifest(
        small_manifest()
    )


# --------------------------------------------------------------------------------------------
# Stages are subsets of their split; no repeated URIs
# --------------------------------------------------------------------------------------------


def test_stage_shard_missing_from_split() -> None:
    data = small_manifest()
    stage_shard_of(data)["uri"] = "s3://bucket/elsewhere"
    assert_shape_error(data, detail="which is not in the split's shards")


@pytest.mark.parametrize(
    ("key", "value"),
    [("records", 1), ("size_bytes", 81), ("etag", '"other"')],
    ids=["records", "size_bytes", "etag"],
)
def test_stage_shard_described_differently(key: str, value: Any) -> None:
    data = small_manifest()
    stage_shard_of(data)[key] = value
    stage_of(data)["records"] = stage_shard_of(data)["records"]
    assert_shape_error(data, detail="differently from the split's shards list")


def test_stages_may_overlap_and_reorder() -> None:
    data = small_manifest()
    shards = copy.deepcopy(entry_of(data)["shards"])
    entry_of(data)["curriculum"]["all"] = {"records": 5, "shards": list(reversed(shards))}
    manifest = validate_manifest(data)
    assert list(manifest.splits["train"].curriculum) == ["warmup", "all"]
    assert [s.uri for s in manifest.splits["train"].curriculum["all"].shards] == [SHARD_B, SHARD_A]


def test_repeated_uri_in_split() -> None:
    data = small_manifest()
    entry_of(data)["shards"].append(copy.deepcopy(shard_of(data)))
    entry_of(data)["records"] = 8
    assert_shape_error(data, detail="is listed more than once")


def test_repeated_uri_in_stage() -> None:
    data = small_manifest()
    stage_of(data)["shards"].append(copy.deepcopy(stage_shard_of(data)))
    stage_of(data)["records"] = 4
    assert_shape_error(data, detail="is listed more than once")


def test_same_shard_in_two_splits_is_allowed() -> None:
    data = small_manifest()
    data["splits"]["validation"] = copy.deepcopy(entry_of(data))
    assert len(validate_manifest(data).splits) == 2
