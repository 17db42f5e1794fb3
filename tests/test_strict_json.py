"""Strict JSON in manifests (syvain_training_data.strict_json): invalid UTF-8 and JSON text,
and the JSON values stage metadata may hold."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from pydantic import ValidationError

from manifest_helpers import (
    EXPECTED_CANONICAL,
    JSON_ERROR,
    SHAPE_ERROR,
    URI,
    UTF8_ERROR,
    assert_shape_error,
    small_manifest,
    stage_of,
)
from syvain_training_data.manifest import (
    canonical_manifest_bytes,
    parse_manifest,
    validate_manifest,
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
# Metadata (JsonObject)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [math.nan, math.inf, -math.inf, (1, 2), {1: "int key"}, b"bytes", {1.5}, object(), "\ud800"],
    ids=["nan", "inf", "-inf", "tuple", "int-key", "bytes", "set", "object", "lone-surrogate"],
)
def test_invalid_metadata_values_from_python(value: Any) -> None:
    data = small_manifest()
    stage_of(data)["metadata"] = {"v": value}
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
    stage_of(data)["metadata"] = {"v": sign * (10**4300 - 1)}
    manifest = validate_manifest(data)
    assert parse_manifest(canonical_manifest_bytes(manifest), URI) == manifest
    stage_of(data)["metadata"] = {"v": sign * 10**4300}
    with pytest.raises(ValidationError, match="more than 4300 digits"):
        validate_manifest(data)
