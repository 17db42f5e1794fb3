"""The manifest tests' shared data: a small valid manifest, its canonical text, the SPEC error
prefixes, and mutations that reach into its split, stage and shards."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from syvain_training_data.manifest import parse_manifest, validate_manifest

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


Mutation = Callable[[dict[str, Any]], None]
Getter = Callable[[dict[str, Any]], dict[str, Any]]


def entry_of(data: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = data["splits"]["train"]
    return entry


def stage_of(data: dict[str, Any]) -> dict[str, Any]:
    stage: dict[str, Any] = entry_of(data)["curriculum"]["warmup"]
    return stage


def shard_of(data: dict[str, Any]) -> dict[str, Any]:
    shard: dict[str, Any] = entry_of(data)["shards"][0]
    return shard


def put(getter: Getter, key: str, value: Any) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        getter(data)[key] = value

    return mutate


def drop(getter: Getter, key: str) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        del getter(data)[key]

    return mutate


def root_of(data: dict[str, Any]) -> dict[str, Any]:
    return data


def stage_shard_of(data: dict[str, Any]) -> dict[str, Any]:
    shard: dict[str, Any] = stage_of(data)["shards"][0]
    return shard


def rename_split(new: str) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        data["splits"] = {new: data["splits"]["train"]}

    return mutate


def rename_stage(new: str) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        entry = entry_of(data)
        entry["curriculum"] = {new: entry["curriculum"]["warmup"]}

    return mutate
