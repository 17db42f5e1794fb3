"""Invalid manifest shapes: one failing example per rule of SPEC section 2, and shard URIs."""

from __future__ import annotations

from typing import Any

import pytest

from manifest_helpers import (
    URI,
    Getter,
    Mutation,
    assert_shape_error,
    drop,
    encode,
    entry_of,
    put,
    rename_split,
    rename_stage,
    root_of,
    shard_of,
    small_manifest,
    stage_of,
    stage_shard_of,
)
from syvain_training_data.manifest import (
    ManifestShard,
    canonical_manifest_bytes,
    parse_manifest,
)

Case = tuple[str, Mutation, str]


def count_cases(
    name: str, getter: Getter, key: str, valid: int, location: str, negative: int | None = None
) -> list[Case]:
    """A count is a strict int > 0: the str, bool and float of a valid count fail at its
    location; zero and a negative count are not greater than 0."""
    below = -valid if negative is None else negative
    return [
        (f"{name}-string", put(getter, key, str(valid)), location),
        (f"{name}-bool", put(getter, key, True), location),
        (f"{name}-float", put(getter, key, float(valid)), location),
        (f"{name}-zero", put(getter, key, 0), "greater than 0"),
        (f"{name}-negative", put(getter, key, below), "greater than 0"),
    ]


SHAPE_CASES: list[Case] = [
    # Top level.
    ("extra-field-manifest", put(root_of, "extra", 1), "extra: Extra inputs are not permitted"),
    ("missing-version", drop(root_of, "version"), "version: Field required"),
    ("version-2", put(root_of, "version", 2), "version: Input should be 1"),
    ("version-0", put(root_of, "version", 0), "version"),
    ("version-string", put(root_of, "version", "1"), "version must be the integer 1"),
    ("version-bool", put(root_of, "version", True), "version must be the integer 1"),
    ("version-float", put(root_of, "version", 1.0), "version must be the integer 1"),
    ("data-format-unknown", put(root_of, "data_format", "csv"), "data_format"),
    ("data-format-case", put(root_of, "data_format", "PARQUET"), "data_format"),
    ("data-format-null", put(root_of, "data_format", None), "data_format"),
    ("missing-data-format", drop(root_of, "data_format"), "data_format: Field required"),
    ("missing-splits", drop(root_of, "splits"), "splits: Field required"),
    ("empty-splits", put(root_of, "splits", {}), "at least one split is required"),
    ("splits-array", put(root_of, "splits", []), "splits"),
    ("empty-split-name", rename_split(""), "split names must be non-empty"),
    # Split entry.
    ("extra-field-split", put(entry_of, "extra", 1), "splits.train.extra: Extra inputs"),
    *count_cases("split-records", entry_of, "records", 5, "splits.train.records"),
    ("split-records-sum", put(entry_of, "records", 6), "records is 6 but its shards hold 5"),
    ("split-empty-shards", put(entry_of, "shards", []), "at least one shard is required"),
    ("split-missing-shards", drop(entry_of, "shards"), "splits.train.shards: Field required"),
    ("split-curriculum-null", put(entry_of, "curriculum", None), "splits.train.curriculum"),
    ("split-curriculum-array", put(entry_of, "curriculum", []), "splits.train.curriculum"),
    ("empty-stage-name", rename_stage(""), "curriculum stage names must be non-empty"),
    # Curriculum stage.
    ("extra-field-stage", put(stage_of, "extra", 1), "curriculum.warmup.extra: Extra inputs"),
    *count_cases("stage-records", stage_of, "records", 2, "curriculum.warmup.records"),
    ("stage-records-sum", put(stage_of, "records", 3), "records is 3 but its shards hold 2"),
    ("stage-empty-shards", put(stage_of, "shards", []), "at least one shard is required"),
    ("stage-missing-shards", drop(stage_of, "shards"), "warmup.shards: Field required"),
    ("stage-metadata-array", put(stage_of, "metadata", [1]), "warmup.metadata"),
    ("stage-metadata-null", put(stage_of, "metadata", None), "warmup.metadata"),
    # Shard.
    ("extra-field-shard", put(shard_of, "extra", 1), "shards.0.extra: Extra inputs"),
    ("extra-field-stage-shard", put(stage_shard_of, "extra", 1), "shards.0.extra: Extra inputs"),
    ("shard-missing-uri", drop(shard_of, "uri"), "shards.0.uri: Field required"),
    ("shard-missing-records", drop(shard_of, "records"), "shards.0.records: Field required"),
    ("shard-missing-size", drop(shard_of, "size_bytes"), "shards.0.size_bytes: Field required"),
    *count_cases("shard-records", shard_of, "records", 3, "shards.0.records"),
    *count_cases("shard-size", shard_of, "size_bytes", 120, "shards.0.size_bytes", negative=-1),
    ("shard-etag-null", put(shard_of, "etag", None), "shards.0.etag"),
    ("shard-etag-int", put(shard_of, "etag", 1), "shards.0.etag"),
    ("shard-uri-int", put(shard_of, "uri", 1), "shards.0.uri"),
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
        "ftp://bucket/key",
        "HTTP://bucket/key",
        "http://user@host/key",
        "https://bucket/",
        "https://user@host/key",
        "hf://models/o/n/key",
        "gs://bucket",
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
    shard_of(data)["uri"] = uri
    assert_shape_error(data, detail="shard URI must be s3://bucket/key")


@pytest.mark.parametrize(
    "uri",
    [
        "s3://b/k",
        "s3://bucket/a/b/c.parquet",
        "s3://b/k%2Fx",
        "file:///data/x.parquet",
        "file:///x",
        "gs://bucket/a/b.parquet",
        "https://data.example.org/corpus/part-0.parquet",
        "hf://datasets/org/corpus@main/data/part-0.parquet",
    ],
)
def test_valid_shard_uri(uri: str) -> None:
    shard = ManifestShard.model_validate({"uri": uri, "records": 1, "size_bytes": 1})
    assert shard.uri == uri
    assert shard.etag == ""


def test_local_file_manifest_round_trips() -> None:
    data = small_manifest()
    shard_of(data)["uri"] = "file:///srv/datasets/demo/shards/train/part-a.jsonl.gz"
    manifest = parse_manifest(encode(data), "file:///srv/datasets/demo/data-manifest-v1.json")
    assert parse_manifest(canonical_manifest_bytes(manifest), URI) == manifest
