"""Manifest bounds: counts and sizes below 2**63, metadata depth, the error summary, and the
256 MiB size limit checked before reading (on both stores)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from manifest_helpers import (
    SHAPE_ERROR,
    URI,
    assert_shape_error,
    encode,
    entry_of,
    small_manifest,
    stage_of,
)
from syvain_training_data import SyvainTrainingData, storage
from syvain_training_data import manifest as manifest_module
from syvain_training_data._native import StreamCounters
from syvain_training_data.manifest import (
    MAX_METADATA_DEPTH,
    canonical_manifest_bytes,
    parse_manifest,
    validate_manifest,
)

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
        for shards in (data["splits"]["train"]["shards"], _counts_stage(data)["shards"]):
            shards[0]["size_bytes"] = value
    elif where == "stage records":
        data = _counts([1, 1])
        _counts_stage(data)["records"] = value
    error = assert_shape_error(data, detail="less than or equal to 9223372036854775807")
    assert len(str(error)) < 2000  # the value is not echoed


def _counts_stage(data: dict[str, Any]) -> dict[str, Any]:
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
    stage_of(data)["metadata"] = {"v": _nested(MAX_METADATA_DEPTH - 1)}
    manifest = parse_manifest(encode(data), URI)
    assert parse_manifest(canonical_manifest_bytes(manifest), URI) == manifest
    stage_of(data)["metadata"] = {"v": _nested(MAX_METADATA_DEPTH)}
    assert_shape_error(data, detail=f"at most {MAX_METADATA_DEPTH} are allowed")
    stage_of(data)["metadata"] = {"v": _nested(600)}  # past pydantic's own recursion limit
    assert_shape_error(data)


def test_many_errors_are_summarised() -> None:
    data = small_manifest()
    bad = [{"uri": f"bad-{i}", "records": 1, "size_bytes": 1} for i in range(50)]
    entry_of(data)["shards"] = bad
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
