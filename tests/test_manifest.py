"""Tests for the data manifest v1 contract (SPEC section 2)."""

from __future__ import annotations

import copy
import json
import math
import pickle
from collections.abc import Callable
from types import MappingProxyType
from typing import Any, get_args

import pytest
from pydantic import ValidationError

from syvain_training_data import SyvainTrainingData, storage
from syvain_training_data import manifest as manifest_module
from syvain_training_data._native import StreamCounters
from syvain_training_data.manifest import (
    DATA_FORMATS,
    MAX_METADATA_DEPTH,
    DataManifest,
    DataManifestDataFormat,
    ManifestCurriculumStage,
    ManifestDatasetEntry,
    ManifestShard,
    canonical_manifest_bytes,
    parse_manifest,
    validate_manifest,
)

URI = "s3://bucket/datasets/demo/data-manifest-v1.json"
UTF8_ERROR = f"Data manifest is not valid UTF-8: {URI}"
JSON_ERROR = f"Data manifest is not valid JSON: {URI}"
SHAPE_ERROR = f"Data manifest has invalid shape: {URI}"

SHARD_A = "s3://bucket/datasets/demo/shards/train/part-a.jsonl.gz"
SHARD_B = "s3://bucket/datasets/demo/shards/train/curriculum/warmup/part-b.jsonl.gz"


def small_manifest() -> dict[str, Any]:
    """A small valid manifest as plain JSON data: one split, one curriculum stage."""
    return {
        "version": 1,
        "data_format": "jsonl.gz",
        "splits": {
            "train": {
                "records": 5,
                "shards": [
                    {"uri": SHARD_A, "records": 3, "size_bytes": 120, "etag": '"abc"'},
                    {"uri": SHARD_B, "records": 2, "size_bytes": 80},
                ],
                "curriculum": {
                    "warmup": {
                        "records": 2,
                        "shards": [{"uri": SHARD_B, "records": 2, "size_bytes": 80}],
                        "metadata": {"lr": 0.5, "tags": ["é", None, True, 3]},
                    }
                },
            }
        },
    }


EXPECTED_CANONICAL = """\
{
  "version": 1,
  "data_format": "jsonl.gz",
  "splits": {
    "train": {
      "records": 5,
      "shards": [
        {
          "uri": "s3://bucket/datasets/demo/shards/train/part-a.jsonl.gz",
          "records": 3,
          "size_bytes": 120,
          "etag": "\\"abc\\""
        },
        {
          "uri": "s3://bucket/datasets/demo/shards/train/curriculum/warmup/part-b.jsonl.gz",
          "records": 2,
          "size_bytes": 80,
          "etag": ""
        }
      ],
      "curriculum": {
        "warmup": {
          "records": 2,
          "shards": [
            {
              "uri": "s3://bucket/datasets/demo/shards/train/curriculum/warmup/part-b.jsonl.gz",
              "records": 2,
              "size_bytes": 80,
              "etag": ""
            }
          ],
          "metadata": {
            "lr": 0.5,
            "tags": [
              "é",
              null,
              true,
              3
            ]
          }
        }
      }
    }
  }
}
"""


def encode(data: Any) -> bytes:
    return json.dumps(data).encode("utf-8")


def assert_shape_error(data: Any, *, detail: str | None = None) -> ValueError:
    """Both entry points reject ``data``; the parse error starts with the SPEC text."""
    with pytest.raises(ValueError) as caught:
        parse_manifest(encode(data), URI)
    error = caught.value
    assert type(error) is ValueError
    message = str(error)
    assert message.startswith(SHAPE_ERROR + "\n")
    assert isinstance(error.__cause__, ValidationError)
    if detail is not None:
        assert detail in message
    if isinstance(data, dict):
        with pytest.raises(ValidationError):
            validate_manifest(data)
    return error


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
# Invalid UTF-8 and invalid JSON
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"\xff",
        b'{"version": 1, "data_format": "\xc3"}',
        b'{"a": "\xed\xa0\x80"}',  # an encoded surrogate is not UTF-8
        EXPECTED_CANONICAL.encode("utf-16"),
    ],
    ids=["lone-ff", "truncated-sequence", "encoded-surrogate", "utf-16"],
)
def test_invalid_utf8(data: bytes) -> None:
    with pytest.raises(ValueError) as caught:
        parse_manifest(data, URI)
    assert str(caught.value) == UTF8_ERROR
    assert isinstance(caught.value.__cause__, UnicodeDecodeError)


def nan_in_metadata(token: str) -> bytes:
    return EXPECTED_CANONICAL.replace('"lr": 0.5', f'"lr": {token}').encode()


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"   ",
        b"{",
        b'{"version": 1,}',
        b"{'version': 1}",
        b'{"version": 1} {}',
        b"// comment\n{}",
        b'{"a": "tab\tinside"}',
        b"\xef\xbb\xbf{}",
        nan_in_metadata("NaN"),
        nan_in_metadata("Infinity"),
        nan_in_metadata("-Infinity"),
        nan_in_metadata("1e400"),
        b'{"version": 1, "version": 1, "data_format": "jsonl.gz", "splits": {}}',
        EXPECTED_CANONICAL.replace('"lr": 0.5', '"lr": 0.5, "lr": 0.5').encode(),
        b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"a": ' + b"9" * 5000 + b"}",
    ],
    ids=[
        "empty",
        "whitespace",
        "unterminated",
        "trailing-comma",
        "single-quotes",
        "trailing-data",
        "comment",
        "control-character",
        "byte-order-mark",
        "nan",
        "infinity",
        "negative-infinity",
        "float-overflow",
        "duplicate-top-level-key",
        "duplicate-metadata-key",
        "too-deep-for-parser",
        "int-too-long",
    ],
)
def test_invalid_json(data: bytes) -> None:
    with pytest.raises(ValueError) as caught:
        parse_manifest(data, URI)
    assert str(caught.value) == JSON_ERROR
    assert isinstance(caught.value.__cause__, ValueError)


# --------------------------------------------------------------------------------------------
# Invalid shape: one failing example per rule
# --------------------------------------------------------------------------------------------

Mutation = Callable[[dict[str, Any]], None]


def _train(data: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = data["splits"]["train"]
    return entry


def _stage(data: dict[str, Any]) -> dict[str, Any]:
    stage: dict[str, Any] = _train(data)["curriculum"]["warmup"]
    return stage


def _shard(data: dict[str, Any]) -> dict[str, Any]:
    shard: dict[str, Any] = _train(data)["shards"][0]
    return shard


def _set(getter: Callable[[dict[str, Any]], dict[str, Any]], key: str, value: Any) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        getter(data)[key] = value

    return mutate


def _delete(getter: Callable[[dict[str, Any]], dict[str, Any]], key: str) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        del getter(data)[key]

    return mutate


def _root(data: dict[str, Any]) -> dict[str, Any]:
    return data


def _stage_shard(data: dict[str, Any]) -> dict[str, Any]:
    shard: dict[str, Any] = _stage(data)["shards"][0]
    return shard


def _rename_split(new: str) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        data["splits"] = {new: data["splits"]["train"]}

    return mutate


def _rename_stage(new: str) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        entry = _train(data)
        entry["curriculum"] = {new: entry["curriculum"]["warmup"]}

    return mutate


SHAPE_CASES: list[tuple[str, Mutation, str]] = [
    # Top level.
    ("extra-field-manifest", _set(_root, "extra", 1), "extra: Extra inputs are not permitted"),
    ("missing-version", _delete(_root, "version"), "version: Field required"),
    ("version-2", _set(_root, "version", 2), "version: Input should be 1"),
    ("version-0", _set(_root, "version", 0), "version"),
    ("version-string", _set(_root, "version", "1"), "version must be the integer 1"),
    ("version-bool", _set(_root, "version", True), "version must be the integer 1"),
    ("version-float", _set(_root, "version", 1.0), "version must be the integer 1"),
    ("data-format-unknown", _set(_root, "data_format", "csv"), "data_format"),
    ("data-format-case", _set(_root, "data_format", "PARQUET"), "data_format"),
    ("data-format-null", _set(_root, "data_format", None), "data_format"),
    ("missing-data-format", _delete(_root, "data_format"), "data_format: Field required"),
    ("missing-splits", _delete(_root, "splits"), "splits: Field required"),
    ("empty-splits", _set(_root, "splits", {}), "at least one split is required"),
    ("splits-array", _set(_root, "splits", []), "splits"),
    ("empty-split-name", _rename_split(""), "split names must be non-empty"),
    # Split entry.
    ("extra-field-split", _set(_train, "extra", 1), "splits.train.extra: Extra inputs"),
    ("split-records-string", _set(_train, "records", "5"), "splits.train.records"),
    ("split-records-bool", _set(_train, "records", True), "splits.train.records"),
    ("split-records-float", _set(_train, "records", 5.0), "splits.train.records"),
    ("split-records-zero", _set(_train, "records", 0), "greater than 0"),
    ("split-records-negative", _set(_train, "records", -5), "greater than 0"),
    ("split-records-sum", _set(_train, "records", 6), "records is 6 but its shards hold 5"),
    ("split-empty-shards", _set(_train, "shards", []), "at least one shard is required"),
    ("split-missing-shards", _delete(_train, "shards"), "splits.train.shards: Field required"),
    ("split-curriculum-null", _set(_train, "curriculum", None), "splits.train.curriculum"),
    ("split-curriculum-array", _set(_train, "curriculum", []), "splits.train.curriculum"),
    ("empty-stage-name", _rename_stage(""), "curriculum stage names must be non-empty"),
    # Curriculum stage.
    ("extra-field-stage", _set(_stage, "extra", 1), "curriculum.warmup.extra: Extra inputs"),
    ("stage-records-string", _set(_stage, "records", "2"), "curriculum.warmup.records"),
    ("stage-records-bool", _set(_stage, "records", True), "curriculum.warmup.records"),
    ("stage-records-zero", _set(_stage, "records", 0), "greater than 0"),
    ("stage-records-negative", _set(_stage, "records", -2), "greater than 0"),
    ("stage-records-sum", _set(_stage, "records", 3), "records is 3 but its shards hold 2"),
    ("stage-empty-shards", _set(_stage, "shards", []), "at least one shard is required"),
    ("stage-missing-shards", _delete(_stage, "shards"), "warmup.shards: Field required"),
    ("stage-metadata-array", _set(_stage, "metadata", [1]), "warmup.metadata"),
    ("stage-metadata-null", _set(_stage, "metadata", None), "warmup.metadata"),
    # Shard.
    ("extra-field-shard", _set(_shard, "extra", 1), "shards.0.extra: Extra inputs"),
    ("extra-field-stage-shard", _set(_stage_shard, "extra", 1), "shards.0.extra: Extra inputs"),
    ("shard-missing-uri", _delete(_shard, "uri"), "shards.0.uri: Field required"),
    ("shard-missing-records", _delete(_shard, "records"), "shards.0.records: Field required"),
    ("shard-missing-size", _delete(_shard, "size_bytes"), "shards.0.size_bytes: Field required"),
    ("shard-records-string", _set(_shard, "records", "3"), "shards.0.records"),
    ("shard-records-bool", _set(_shard, "records", True), "shards.0.records"),
    ("shard-records-zero", _set(_shard, "records", 0), "greater than 0"),
    ("shard-records-negative", _set(_shard, "records", -3), "greater than 0"),
    ("shard-size-string", _set(_shard, "size_bytes", "120"), "shards.0.size_bytes"),
    ("shard-size-bool", _set(_shard, "size_bytes", True), "shards.0.size_bytes"),
    ("shard-size-float", _set(_shard, "size_bytes", 120.0), "shards.0.size_bytes"),
    ("shard-size-zero", _set(_shard, "size_bytes", 0), "greater than 0"),
    ("shard-size-negative", _set(_shard, "size_bytes", -1), "greater than 0"),
    ("shard-etag-null", _set(_shard, "etag", None), "shards.0.etag"),
    ("shard-etag-int", _set(_shard, "etag", 1), "shards.0.etag"),
    ("shard-uri-int", _set(_shard, "uri", 1), "shards.0.uri"),
]


@pytest.mark.parametrize(
    ("mutate", "detail"),
    [pytest.param(mutate, detail, id=case_id) for case_id, mutate, detail in SHAPE_CASES],
)
def test_invalid_shape(mutate: Mutation, detail: str) -> None:
    data = small_manifest()
    mutate(data)
    assert_shape_error(data, detail=detail)


@pytest.mark.parametrize(
    ("data", "detail"),
    [
        ([], "<manifest>: Input should be a valid dictionary"),
        ("manifest", "<manifest>: Input should be a valid dictionary"),
        (None, "<manifest>: Input should be a valid dictionary"),
        ({}, "version: Field required"),
    ],
    ids=["array", "string", "null", "empty-object"],
)
def test_invalid_top_level(data: Any, detail: str) -> None:
    assert_shape_error(data, detail=detail)


@pytest.mark.parametrize(
    "uri",
    [
        "http://bucket/key",
        "https://bucket/key",
        "S3://bucket/key",
        "s3:/bucket/key",
        "s3://bucket",
        "s3://bucket/",
        "s3:///key",
        "s3://",
        "bucket/key",
        "",
        " s3://bucket/key",
        "file:relative/path",
        "file://relative/path",
        "file://host/absolute/path",
        "file:/absolute/path",
        "file:///",
        "file://",
        "/absolute/path",
    ],
    ids=lambda uri: uri or "empty",
)
def test_invalid_shard_uri(uri: str) -> None:
    data = small_manifest()
    _shard(data)["uri"] = uri
    assert_shape_error(data, detail="shard URI must be s3://bucket/key")


@pytest.mark.parametrize(
    "uri",
    [
        "s3://b/k",
        "s3://bucket/a/b/c.parquet",
        "s3://b/k%2Fx",
        "file:///data/x.parquet",
        "file:///x",
    ],
)
def test_valid_shard_uri(uri: str) -> None:
    shard = ManifestShard.model_validate({"uri": uri, "records": 1, "size_bytes": 1})
    assert shard.uri == uri
    assert shard.etag == ""


def test_local_file_manifest_round_trips() -> None:
    data = small_manifest()
    _shard(data)["uri"] = "file:///srv/datasets/demo/shards/train/part-a.jsonl.gz"
    manifest = parse_manifest(encode(data), "file:///srv/datasets/demo/data-manifest-v1.json")
    assert parse_manifest(canonical_manifest_bytes(manifest), URI) == manifest


# --------------------------------------------------------------------------------------------
# Stages are subsets of their split; no repeated URIs
# --------------------------------------------------------------------------------------------


def test_stage_shard_missing_from_split() -> None:
    data = small_manifest()
    _stage_shard(data)["uri"] = "s3://bucket/elsewhere"
    assert_shape_error(data, detail="which is not in the split's shards")


@pytest.mark.parametrize(
    ("key", "value"),
    [("records", 1), ("size_bytes", 81), ("etag", '"other"')],
    ids=["records", "size_bytes", "etag"],
)
def test_stage_shard_described_differently(key: str, value: Any) -> None:
    data = small_manifest()
    _stage_shard(data)[key] = value
    _stage(data)["records"] = _stage_shard(data)["records"]
    assert_shape_error(data, detail="differently from the split's shards list")


def test_stages_may_overlap_and_reorder() -> None:
    data = small_manifest()
    shards = copy.deepcopy(_train(data)["shards"])
    _train(data)["curriculum"]["all"] = {"records": 5, "shards": list(reversed(shards))}
    manifest = validate_manifest(data)
    assert list(manifest.splits["train"].curriculum) == ["warmup", "all"]
    assert [s.uri for s in manifest.splits["train"].curriculum["all"].shards] == [SHARD_B, SHARD_A]


def test_repeated_uri_in_split() -> None:
    data = small_manifest()
    _train(data)["shards"].append(copy.deepcopy(_shard(data)))
    _train(data)["records"] = 8
    assert_shape_error(data, detail="is listed more than once")


def test_repeated_uri_in_stage() -> None:
    data = small_manifest()
    _stage(data)["shards"].append(copy.deepcopy(_stage_shard(data)))
    _stage(data)["records"] = 4
    assert_shape_error(data, detail="is listed more than once")


def test_same_shard_in_two_splits_is_allowed() -> None:
    data = small_manifest()
    data["splits"]["validation"] = copy.deepcopy(_train(data))
    assert len(validate_manifest(data).splits) == 2


# --------------------------------------------------------------------------------------------
# Metadata (JsonObject)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [math.nan, math.inf, -math.inf, (1, 2), {1: "int key"}, b"bytes", {1.5}, object(), "\ud800"],
    ids=["nan", "inf", "-inf", "tuple", "int-key", "bytes", "set", "object", "lone-surrogate"],
)
def test_invalid_metadata_values_from_python(value: Any) -> None:
    data = small_manifest()
    _stage(data)["metadata"] = {"v": value}
    with pytest.raises(ValidationError, match=r"curriculum\.warmup\.metadata"):
        validate_manifest(data)


def test_lone_surrogate_escape_in_json_is_invalid_shape() -> None:
    text = EXPECTED_CANONICAL.replace('"lr": 0.5', '"lr": "\\ud800"')
    assert_shape_error(json.loads(text), detail="lone surrogate")
    with pytest.raises(ValueError, match="lone surrogate") as caught:
        parse_manifest(text.encode(), URI)
    assert str(caught.value).startswith(SHAPE_ERROR + "\n")


def test_paired_surrogate_escape_in_json_is_fine() -> None:
    text = EXPECTED_CANONICAL.replace('"lr": 0.5', '"lr": "\\ud83d\\ude00"')
    manifest = parse_manifest(text.encode(), URI)
    assert manifest.splits["train"].curriculum["warmup"].metadata["lr"] == "\U0001f600"


def test_bool_metadata_stays_bool() -> None:
    manifest = validate_manifest(small_manifest())
    tags = manifest.splits["train"].curriculum["warmup"].metadata["tags"]
    assert isinstance(tags, list)
    assert type(tags[2]) is bool and type(tags[3]) is int


@pytest.mark.parametrize("sign", [1, -1], ids=["positive", "negative"])
def test_integer_digit_limit(sign: int) -> None:
    data = small_manifest()
    _stage(data)["metadata"] = {"v": sign * (10**4300 - 1)}
    manifest = validate_manifest(data)
    assert parse_manifest(canonical_manifest_bytes(manifest), URI) == manifest
    _stage(data)["metadata"] = {"v": sign * 10**4300}
    with pytest.raises(ValidationError, match="more than 4300 digits"):
        validate_manifest(data)


MAX = 2**63 - 1


def _counts(shard_records: list[int], sizes: list[int] | None = None) -> dict[str, Any]:
    """A one-split manifest whose shards hold ``shard_records`` (split records: their sum)."""
    sizes = sizes or [1] * len(shard_records)
    shards = [
        {"uri": f"s3://b/k{i}", "records": n, "size_bytes": size, "etag": ""}
        for i, (n, size) in enumerate(zip(shard_records, sizes, strict=True))
    ]
    return {
        "version": 1,
        "data_format": "msgpack.zstf",
        "splits": {
            "train": {
                "records": sum(shard_records),
                "shards": shards,
                "curriculum": {
                    "s": {"records": shard_records[0], "shards": shards[:1], "metadata": {}}
                },
            }
        },
    }


def test_counts_and_sizes_up_to_2_63_minus_1_are_kept_byte_for_byte() -> None:
    data = _counts([MAX], [MAX])
    # What another implementation writes: canonical text with the largest counts.
    text = json.dumps(data, indent=2).encode() + b"\n"
    manifest = parse_manifest(text, URI)
    assert manifest.splits["train"].shards[0].records == MAX
    assert canonical_manifest_bytes(manifest) == text
    several = _counts([2**62, 2**62 - 1], [2**62, 2**62 - 1])
    assert canonical_manifest_bytes(validate_manifest(several)) == (
        json.dumps(several, indent=2).encode() + b"\n"
    )


@pytest.mark.parametrize(
    "value", [2**63, 2**64, 10**30, 10**1000], ids=["2**63", "2**64", "10**30", "10**1000"]
)
@pytest.mark.parametrize("where", ["shard records", "shard size_bytes", "stage records"])
def test_counts_and_sizes_of_2_63_or_more_are_invalid_shape(where: str, value: int) -> None:
    data = _counts([value, 1])
    data["splits"]["train"]["records"] = 1  # the split's own cap is tested below
    if where == "shard size_bytes":
        data = _counts([1, 1])
        for shards in (data["splits"]["train"]["shards"], _stage_of(data)["shards"]):
            shards[0]["size_bytes"] = value
    elif where == "stage records":
        data = _counts([1, 1])
        _stage_of(data)["records"] = value
    error = assert_shape_error(data, detail="less than or equal to 9223372036854775807")
    assert len(str(error)) < 2000  # the value is not echoed


def _stage_of(data: dict[str, Any]) -> dict[str, Any]:
    stage: dict[str, Any] = data["splits"]["train"]["curriculum"]["s"]
    return stage


def test_split_records_summing_past_2_63_are_invalid_shape() -> None:
    # Each shard is valid; their sum (the split's records) is not.
    assert_shape_error(
        _counts([2**62, 2**62]), detail="records: Input should be less than or equal to"
    )
    assert_shape_error(_counts([MAX, 1]))


def test_split_sizes_summing_past_2_63_are_invalid_shape() -> None:
    assert_shape_error(
        _counts([1, 1], [2**62, 2**62]),
        detail="the split's shards hold 9223372036854775808 bytes in total; at most 2**63 - 1",
    )
    assert validate_manifest(_counts([1, 1], [2**62, 2**62 - 1]))


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_metadata_depth_limit() -> None:
    data = small_manifest()
    _stage(data)["metadata"] = {"v": _nested(MAX_METADATA_DEPTH - 1)}
    manifest = parse_manifest(encode(data), URI)
    assert parse_manifest(canonical_manifest_bytes(manifest), URI) == manifest
    _stage(data)["metadata"] = {"v": _nested(MAX_METADATA_DEPTH)}
    assert_shape_error(data, detail=f"at most {MAX_METADATA_DEPTH} are allowed")
    _stage(data)["metadata"] = {"v": _nested(600)}  # past pydantic's own recursion limit
    assert_shape_error(data)


def test_many_errors_are_summarised() -> None:
    data = small_manifest()
    _train(data)["shards"] = [{"uri": f"bad-{i}", "records": 1, "size_bytes": 1} for i in range(50)]
    error = assert_shape_error(data)
    lines = str(error).splitlines()
    assert lines[0] == SHAPE_ERROR
    assert lines[-1] == "  ... and 30 more errors"
    assert len(lines) == 22


# --------------------------------------------------------------------------------------------
# Manifest size limit (256 MiB), checked before reading
# --------------------------------------------------------------------------------------------


def test_a_local_manifest_over_256_mib_is_refused_before_a_byte_is_read(tmp_path: Any) -> None:
    path = tmp_path / "data-manifest.json"
    with open(path, "wb") as file:  # sparse: no disk, no memory
        file.truncate(256 * 1024 * 1024 + 1)
    uri = f"file://{path}"
    with StreamCounters() as counters, pytest.raises(ValueError) as caught:
        SyvainTrainingData().load_manifest(uri)
    assert str(caught.value) == (
        f"Data manifest is too large: {uri} holds 268435457 bytes; the limit is 268435456 "
        "bytes (256 MiB)"
    )
    assert (counters.streams, counters.bytes) == (0, 0)


@pytest.fixture(params=["file", "s3"])
def manifest_store(request: Any, tmp_path: Any, monkeypatch: Any) -> tuple[SyvainTrainingData, str]:
    """(client, a folder URI) on the local store or SeaweedFS, with a 1000-byte limit."""
    monkeypatch.setattr(manifest_module, "MAX_MANIFEST_BYTES", 1000)
    if request.param == "file":
        return SyvainTrainingData(), f"file://{tmp_path}"
    seaweed = request.getfixturevalue("seaweed")
    bucket = request.getfixturevalue("s3_bucket")
    prefix = request.getfixturevalue("unique_prefix")
    return SyvainTrainingData.from_env(seaweed.env()), f"s3://{bucket}/{prefix}"


def _padded(size: int) -> bytes:
    """A valid manifest of exactly ``size`` bytes (trailing whitespace)."""
    data = json.dumps(small_manifest()).encode()
    return data + b" " * (size - len(data))


def test_manifest_size_limit_on_both_stores(manifest_store: Any) -> None:
    client, root = manifest_store
    config = client.storage_config
    at_limit, over = f"{root}/at-limit.json", f"{root}/over.json"
    storage.put_object(at_limit, _padded(1000), storage_config=config)
    storage.put_object(over, _padded(1001), storage_config=config)
    with StreamCounters() as counters:
        assert client.load_manifest(at_limit) == validate_manifest(small_manifest())
    # Read once: one stream, each byte received once.
    assert (counters.streams, counters.bytes) == (1, 1000)
    with StreamCounters() as counters, pytest.raises(ValueError) as caught:
        client.load_manifest(over)
    assert str(caught.value) == (
        f"Data manifest is too large: {over} holds 1001 bytes; the limit is 1000 bytes "
        f"({1000 / 2**20:g} MiB)"
    )
    assert (counters.streams, counters.bytes) == (0, 0)
    with pytest.raises(ValueError, match="Data manifest is too large: u holds 1001 bytes"):
        parse_manifest(_padded(1001), "u")


def test_a_saver_meeting_an_oversized_manifest_reports_a_conflict(manifest_store: Any) -> None:
    from syvain_training_data import PublicationConflictError

    client, root = manifest_store
    uri = f"{root}/saved/data-manifest.json"
    storage.put_object(uri, b" " * 1001, storage_config=client.storage_config)
    saver = client.dataset_saver(uri)
    saver.save("train", None, [{"a": 1}])
    with pytest.raises(PublicationConflictError, match="An invalid manifest already exists"):
        saver.commit_manifest()
