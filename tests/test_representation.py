"""The OLMo 3 representation loader (SPEC section 7) against SeaweedFS.

A complete publication is written by ``representation_fixture.PublicationBuilder`` at the
canonical path of a fresh recipe; the loader must return exactly the builder's tensors in the
specified order. Then every rule of the section is broken on its own, in an otherwise valid
publication, and the error type and message are checked. Every test runs with ``TMPDIR`` set
to an empty directory that must be empty again when the test ends (successes, errors and
early closes leave no temporary file).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fault_proxy import reset_after, stall_after
from representation_fixture import PublicationBuilder, Published, Task, sha256
from syvain_training_data import (
    ObjectChangedError,
    ObjectDataError,
    RepresentationExample,
    RepresentationIntegrityError,
    ShardDataError,
    StorageRetryExhaustedError,
    SyvainTrainingData,
    _native,
    storage,
)
from syvain_training_data.representation import iter_representation_examples
from syvain_training_data.representation.custody import (
    Claim,
    Prefetcher,
    Workspace,
    custody_errors,
)
from syvain_training_data.storage import StorageConfig, native_storage
from syvain_training_data.testing import storage_policy

pytestmark = pytest.mark.timeout(300)

REQUEST: dict[str, Any] = {
    "split": "analysis",
    "sources": ["dolmino", "common_pile"],
    "per_source_count": 4,
    "teacher_layer": 3,
    "state_kind": "post_attention",
}
SMALL = {"basis_fit": 2, "analysis": 3, "validation": 2}
FAKE_URI = (
    "s3://syvain-data/shared-data/distill-olmo3-representation-v1/"
    + "ab" * 32
    + "/publication-v2/data-manifest-v1.json"
)


@pytest.fixture(autouse=True)
def temp_dir(seaweed, tmp_path, monkeypatch) -> Iterator[Path]:
    """TMPDIR for the test; it must be empty again at the end."""
    path = tmp_path / "tmp"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    yield path
    assert sorted(os.listdir(path)) == []


@pytest.fixture
def config(seaweed) -> StorageConfig:
    return StorageConfig.create(
        s3_base_url=seaweed.endpoint,
        region=seaweed.region,
        access_key_id=seaweed.access_key_id,
        secret_access_key=seaweed.secret_access_key,
    )


@pytest.fixture
def builder() -> PublicationBuilder:
    return PublicationBuilder(blocks_per_task=SMALL, seed=7)


def load(published: Published, config: StorageConfig, **overrides: Any) -> list[Any]:
    request = {**REQUEST, **overrides}
    return list(
        iter_representation_examples(
            published.manifest_uri,
            published.manifest_sha256,
            storage_config=config,
            **request,
        )
    )


def assert_examples(examples: list[Any], builder: PublicationBuilder, **overrides: Any) -> None:
    request = {**REQUEST, **overrides}
    expected = builder.expected(
        request["split"],
        request["sources"],
        request["per_source_count"],
        request["teacher_layer"],
        request["state_kind"],
    )
    assert [(e.block_id, e.source, e.split) for e in examples] == [
        (x.block_id, x.source, x.split) for x in expected
    ]
    for example, want in zip(examples, expected, strict=True):
        assert isinstance(example, RepresentationExample)
        assert example.input_ids.dtype == torch.int64
        assert example.input_ids.shape == (2048,)
        assert example.relation_positions.dtype == torch.int64
        assert example.relation_positions.shape == (32,)
        assert example.teacher_final_state_projections.dtype == torch.float16
        assert example.teacher_final_state_projections.shape == (32, 256)
        assert np.array_equal(example.input_ids.numpy(), want.input_ids)
        assert np.array_equal(example.relation_positions.numpy(), want.relation_positions)
        assert np.array_equal(example.teacher_final_state_projections.numpy(), want.projections)


def broken(
    builder: PublicationBuilder,
    config: StorageConfig,
    match: str,
    *,
    error: type[BaseException] = RepresentationIntegrityError,
    request: dict[str, Any] | None = None,
    **hooks: Any,
) -> BaseException:
    """Publishes with the hooks and asserts that loading raises ``error`` matching ``match``."""
    published = builder.publish(config, **hooks)
    with pytest.raises(error, match=match) as info:
        load(published, config, **(request or {}))
    return info.value


# --------------------------------------------------------------------------------------------
# The whole publication, read back
# --------------------------------------------------------------------------------------------


def test_loader_returns_the_builders_tensors_in_order(builder, config):
    published = builder.publish(config)
    examples = load(published, config)
    assert_examples(examples, builder)
    # The selection spans both tasks of each source and the yield order is the caller's.
    assert [e.source for e in examples] == ["dolmino"] * 4 + ["common_pile"] * 4
    assert sorted(e.block_id for e in examples[:4]) == [e.block_id for e in examples[:4]]
    assert len({task.name for task, _ in builder.candidates("analysis", "dolmino")[:4]}) == 2


@pytest.mark.parametrize(
    ("split", "sources", "count", "layer", "kind"),
    [
        ("basis_fit", ["common_pile"], 4, 0, "residual_pre"),
        ("validation", ["dolmino", "common_pile"], 1, 7, "post_mlp"),
        ("analysis", ["common_pile", "dolmino"], 6, 0, "post_attention"),
    ],
)
def test_every_split_layer_and_state_kind(builder, config, split, sources, count, layer, kind):
    published = builder.publish(config)
    request = {
        "split": split,
        "sources": sources,
        "per_source_count": count,
        "teacher_layer": layer,
        "state_kind": kind,
    }
    assert_examples(load(published, config, **request), builder, **request)


def test_client_method(builder, config, seaweed):
    published = builder.publish(config)
    client = SyvainTrainingData(
        s3_base_url=seaweed.endpoint,
        region=seaweed.region,
        access_key_id=seaweed.access_key_id,
        secret_access_key=seaweed.secret_access_key,
    )
    examples = list(
        client.iter_representation_examples(
            published.manifest_uri, published.manifest_sha256, **REQUEST
        )
    )
    assert_examples(examples, builder)


def test_examples_own_their_tensors_and_no_file_stays(builder, config, temp_dir):
    published = builder.publish(config)
    generator = iter_representation_examples(
        published.manifest_uri, published.manifest_sha256, storage_config=config, **REQUEST
    )
    first = next(generator)
    assert os.listdir(temp_dir) == []  # the workspace is gone while examples are alive
    rest = list(generator)
    for example in [first, *rest]:
        for tensor in (
            example.input_ids,
            example.relation_positions,
            example.teacher_final_state_projections,
        ):
            assert tensor.is_contiguous()
            assert tensor.storage_offset() == 0
            # The storage holds exactly this tensor: not a view of a window, file or artifact.
            assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
            assert tensor.untyped_storage().filename is None
        example.input_ids[0] = -1  # writable, and no one else sees it
    assert "block_id=" in repr(first) and "float16 [32, 256]" in repr(first)


def test_each_needed_artifact_is_downloaded_once(builder, config, monkeypatch):
    published = builder.publish(config)
    downloaded: list[str] = []
    original = _native.download_object

    def counting(storage_: Any, uri: str, *args: Any, **kwargs: Any) -> tuple[int, str]:
        downloaded.append(uri)
        return original(storage_, uri, *args, **kwargs)

    monkeypatch.setattr(_native, "download_object", counting)
    load(published, config)
    assert len(downloaded) == len(set(downloaded))
    selected_tasks = {
        task.name
        for source in REQUEST["sources"]
        for task, _ in builder.candidates("analysis", source)[:4]
    }
    requested = [
        task
        for task in builder.tasks
        if task.split == "analysis" and task.source in REQUEST["sources"]
    ]
    expected = {published.manifest_uri, f"{published.prefix}artifact-manifest-v2.json"}
    for task in requested:
        expected.add(task.prepared_uri.replace(".safetensors", ".parquet"))
        if task.name in selected_tasks:
            expected.add(task.prepared_uri)
            expected.add(task.representation_uri)
            expected.add(task.representation_uri.replace(".safetensors", ".parquet"))
    assert set(downloaded) == expected


def test_early_close_and_unstarted_generators_leave_nothing(builder, config, temp_dir):
    published = builder.publish(config)
    generator = iter_representation_examples(
        published.manifest_uri, published.manifest_sha256, storage_config=config, **REQUEST
    )
    next(generator)
    generator.close()
    assert os.listdir(temp_dir) == []
    unstarted = iter_representation_examples(
        published.manifest_uri, published.manifest_sha256, storage_config=config, **REQUEST
    )
    unstarted.close()
    del unstarted
    assert os.listdir(temp_dir) == []


def test_loader_resumes_through_network_faults(builder, config, seaweed, fault_proxy):
    published = builder.publish(config)
    through_proxy = StorageConfig.create(
        s3_base_url=fault_proxy.endpoint,
        region=seaweed.region,
        access_key_id=seaweed.access_key_id,
        secret_access_key=seaweed.secret_access_key,
    )
    fault_proxy.script(
        # A FIFO queue: the artifact manifest is read before the representation files.
        reset_after(10, method="GET", target="artifact-manifest"),
        reset_after(100_000, method="GET", target="representations.safetensors"),
    )
    with storage_policy(backoff_base_s=0.01, backoff_cap_s=0.05):
        examples = load(published, through_proxy)
    assert_examples(examples, builder)
    assert fault_proxy.faults_applied == 2


# --------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"manifest_uri": FAKE_URI.replace("syvain-data", "other-bucket")}, ValueError),
        ({"manifest_uri": FAKE_URI.replace("ab" * 32, "AB" * 32)}, ValueError),
        ({"manifest_uri": FAKE_URI.replace("publication-v2", "publication-v1")}, ValueError),
        ({"manifest_uri": FAKE_URI + ".bak"}, ValueError),
        ({"manifest_uri": 7}, TypeError),
        ({"manifest_sha256": "AB" * 32}, ValueError),
        ({"manifest_sha256": "ab" * 31}, ValueError),
        ({"manifest_sha256": None}, TypeError),
        ({"split": "train"}, ValueError),
        ({"split": None}, TypeError),
        ({"sources": []}, ValueError),
        ({"sources": ["dolmino", "dolmino"]}, ValueError),
        ({"sources": ["wikipedia"]}, ValueError),
        ({"sources": "dolmino"}, TypeError),
        ({"sources": {"dolmino"}}, TypeError),
        ({"sources": [1]}, TypeError),
        ({"per_source_count": 0}, ValueError),
        ({"per_source_count": -2}, ValueError),
        ({"per_source_count": True}, TypeError),
        ({"per_source_count": 2.0}, TypeError),
        ({"per_source_count": "2"}, TypeError),
        ({"teacher_layer": 1}, ValueError),
        ({"teacher_layer": 32}, ValueError),
        ({"teacher_layer": True}, TypeError),
        ({"teacher_layer": 3.0}, TypeError),
        ({"state_kind": "post_ffn"}, ValueError),
        ({"state_kind": None}, TypeError),
    ],
)
def test_argument_validation_is_immediate(overrides, error):
    arguments = {"manifest_uri": FAKE_URI, "manifest_sha256": "ab" * 32, **REQUEST, **overrides}
    manifest_uri = arguments.pop("manifest_uri")
    manifest_sha256 = arguments.pop("manifest_sha256")
    with pytest.raises(error):
        iter_representation_examples(manifest_uri, manifest_sha256, **arguments)


def test_missing_manifest_is_file_not_found(config):
    generator = iter_representation_examples(FAKE_URI, "ab" * 32, storage_config=config, **REQUEST)
    with pytest.raises(FileNotFoundError):
        next(generator)


def test_without_the_extra_the_error_names_it():
    code = (
        "import sys\n"
        "sys.modules['safetensors'] = None\n"
        "import syvain_training_data as package\n"
        "assert issubclass(package.RepresentationIntegrityError, RuntimeError)\n"
        "for heavy in ('numpy', 'torch', 'pyarrow', 'safetensors'):\n"
        "    assert sys.modules.get(heavy) is None, heavy\n"
        "for attempt in (lambda: package.RepresentationExample,\n"
        "                lambda: package.SyvainTrainingData().iter_representation_examples(\n"
        "                    'x', 'y', split='analysis', sources=['dolmino'],\n"
        "                    per_source_count=1, teacher_layer=3, state_kind='post_mlp')):\n"
        "    try:\n"
        "        attempt()\n"
        "    except ModuleNotFoundError as error:\n"
        "        print(error)\n"
        "    else:\n"
        "        raise SystemExit('no error')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2
    for line in lines:
        assert "'representation' extra" in line
        assert "pip install 'syvain-training-data[representation]'" in line


# --------------------------------------------------------------------------------------------
# Data manifest
# --------------------------------------------------------------------------------------------


def _manifest_split(split: str) -> Callable[[dict[str, Any]], None]:
    def hook(manifest: dict[str, Any]) -> None:
        manifest["splits"]["train"] = manifest["splits"][split]

    return hook


def _compact(data: bytes) -> bytes:
    return json.dumps(json.loads(data)).encode()


def _set_shard(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def hook(manifest: dict[str, Any]) -> None:
        manifest["splits"]["analysis"]["shards"][0].update(changes)
        if "records" in changes:
            manifest["splits"]["analysis"]["records"] = changes["records"]

    return hook


def _bump_records(manifest: dict[str, Any]) -> None:
    entry = manifest["splits"]["validation"]
    entry["records"] += 1
    entry["shards"][0]["records"] += 1


def _two_shards(manifest: dict[str, Any]) -> None:
    entry = manifest["splits"]["analysis"]
    extra = dict(manifest["splits"]["basis_fit"]["shards"][0])
    entry["shards"].append(extra)
    entry["records"] += extra["records"]


def _other_shard_uri(manifest: dict[str, Any]) -> None:
    shard = manifest["splits"]["analysis"]["shards"][0]
    shard["uri"] = shard["uri"].replace("final/index/", "final/index-v2/")


def _with_curriculum(manifest: dict[str, Any]) -> None:
    entry = manifest["splits"]["analysis"]
    entry["curriculum"] = {
        "all": {"records": entry["records"], "shards": list(entry["shards"]), "metadata": {}}
    }


def _drop_split(manifest: dict[str, Any]) -> None:
    del manifest["splits"]["validation"]


def _format(manifest: dict[str, Any]) -> None:
    manifest["data_format"] = "jsonl.gz"


@pytest.mark.parametrize(
    ("hooks", "match"),
    [
        pytest.param(
            {"manifest_bytes_hook": lambda d: b"{" + d}, "not a valid manifest", id="json"
        ),
        pytest.param(
            {"manifest_hook": lambda m: m.update(version=2)}, "not a valid manifest", id="shape"
        ),
        pytest.param({"manifest_bytes_hook": _compact}, "canonical", id="not-canonical"),
        pytest.param({"manifest_hook": _format}, "data_format", id="format"),
        pytest.param(
            {"manifest_hook": _manifest_split("analysis")}, "splits are", id="extra-split"
        ),
        pytest.param({"manifest_hook": _drop_split}, "splits are", id="missing-split"),
        pytest.param({"manifest_hook": _with_curriculum}, "curriculum", id="curriculum"),
        pytest.param({"manifest_hook": _two_shards}, "must have the one shard", id="two-shards"),
        pytest.param({"manifest_hook": _other_shard_uri}, "must have the one shard", id="uri"),
        pytest.param({"manifest_hook": _set_shard(etag="")}, "no etag", id="etag-empty"),
        pytest.param({"manifest_hook": _set_shard(etag='""')}, "no etag", id="etag-quotes"),
        pytest.param(
            {
                "manifest_hook": lambda m: m["splits"]["analysis"]["shards"][0].update(
                    size_bytes=m["splits"]["analysis"]["shards"][0]["size_bytes"] + 1
                )
            },
            "bytes but the manifest says",
            id="index-size",
        ),
        pytest.param(
            {"manifest_hook": _set_shard(etag='"0123456789abcdef"')},
            "etag .* but the manifest says",
            id="index-etag",
        ),
        pytest.param({"manifest_hook": _bump_records}, "declared .* records", id="index-rows"),
    ],
)
def test_manifest_rules(builder, config, hooks, match):
    broken(builder, config, match, **hooks)


def test_manifest_digest_must_match(builder, config):
    published = builder.publish(config)
    with pytest.raises(RepresentationIntegrityError, match="SHA-256"):
        list(
            iter_representation_examples(
                published.manifest_uri, "00" * 32, storage_config=config, **REQUEST
            )
        )


def test_missing_index_shard(builder, config):
    published = builder.publish(config)
    storage.delete_object(f"{published.prefix}final/index/basis_fit.parquet", storage_config=config)
    with pytest.raises(RepresentationIntegrityError, match="does not exist"):
        load(published, config)


# --------------------------------------------------------------------------------------------
# Index
# --------------------------------------------------------------------------------------------


Rows = dict[str, list[dict[str, Any]]]


def _pair_row(rows: Rows, role: str = "prepared_blocks", split: str = "analysis") -> dict[str, Any]:
    return next(
        r for r in rows[split] if r["entry_kind"] == "paired_artifact" and r["role"] == role
    )


def _singleton_row(rows: Rows, role: str) -> dict[str, Any]:
    return next(r for r in rows["analysis"] if r["role"] == role)


def _index(change: Callable[[Rows], None]) -> dict[str, Any]:
    return {"index_hook": change}


def _set_pair(**changes: Any) -> dict[str, Any]:
    return _index(lambda rows: _pair_row(rows).update(changes))


def _set_singleton(which: str, /, **changes: Any) -> dict[str, Any]:
    return _index(lambda rows: _singleton_row(rows, which).update(changes))


def _all_rows(change: Callable[[dict[str, Any]], None], split: str) -> dict[str, Any]:
    def hook(rows: Rows) -> None:
        for row in rows[split]:
            change(row)

    return _index(hook)


def _move_recipe_to_validation(rows: Rows) -> None:
    row = _singleton_row(rows, "recipe")
    rows["analysis"].remove(row)
    rows["validation"].append({**row, "split": "validation"})


def _claim_twice(rows: Rows) -> None:
    rows["analysis"].append(dict(_singleton_row(rows, "recipe")))


def _wrong_split(rows: Rows) -> None:
    rows["basis_fit"][0]["split"] = "validation"


@pytest.mark.parametrize(
    ("hooks", "match"),
    [
        pytest.param(_index(_wrong_split), "split is 'validation' in the 'basis_fit'", id="split"),
        pytest.param(_all_rows(lambda r: r.update(extra=1), "basis_fit"), "columns", id="extra"),
        pytest.param(
            _all_rows(lambda r: r.pop("singleton_sha256"), "validation"), "columns", id="missing"
        ),
        pytest.param(_set_pair(entry_kind="paired"), "entry_kind", id="entry-kind"),
        # paired_artifact rows
        pytest.param(_set_pair(role="attention_maps"), "role 'attention_maps'", id="pair-role"),
        pytest.param(_set_pair(source="wikipedia"), "source 'wikipedia'", id="pair-source"),
        pytest.param(_set_pair(tensor_offset=1), "tensor_offset must be 0", id="tensor-offset"),
        pytest.param(_set_pair(metadata_offset=2), "metadata_offset must be 0", id="meta-offset"),
        pytest.param(
            _set_pair(tensor_records=0, tensor_total_records=0),
            "tensor_records must be a positive",
            id="records-zero",
        ),
        pytest.param(
            _set_pair(metadata_total_records=99), "metadata_records .* differs", id="records-total"
        ),
        pytest.param(
            _index(
                lambda rows: _pair_row(rows).update(
                    safetensors_uri=_pair_row(rows)["safetensors_uri"] + ".bin"
                )
            ),
            "does not end in .safetensors",
            id="tensor-uri",
        ),
        pytest.param(
            _index(
                lambda rows: _pair_row(rows).update(
                    metadata_uri=_pair_row(rows)["metadata_uri"] + ".gz"
                )
            ),
            "with .parquet",
            id="metadata-uri",
        ),
        pytest.param(_set_pair(singleton_size_bytes=5), "must have null", id="pair-singleton"),
        # singleton_artifact rows
        pytest.param(_set_singleton("recipe", source="dolmino"), "__publication__", id="s-source"),
        pytest.param(_index(_move_recipe_to_validation), "must have analysis", id="s-split"),
        pytest.param(_set_singleton("recipe", role=None), "role must be a non-empty", id="s-role"),
        pytest.param(_set_singleton("recipe", tensor_offset=0), "must have null", id="s-pair"),
        pytest.param(
            _set_singleton("artifact_manifest", role="artifact_manifest_v1"),
            "0 artifact_manifest rows",
            id="no-artifact-manifest",
        ),
        pytest.param(
            _set_singleton("recipe", role="artifact_manifest"),
            "2 artifact_manifest rows",
            id="two-artifact-manifests",
        ),
        pytest.param(
            _index(
                lambda rows: _singleton_row(rows, "artifact_manifest").update(
                    singleton_uri=_singleton_row(rows, "artifact_manifest")[
                        "singleton_uri"
                    ].replace("-v2.json", "-v3.json")
                )
            ),
            "artifact manifest is claimed at",
            id="artifact-manifest-uri",
        ),
        # every row
        pytest.param(_index(_claim_twice), "more than once", id="uri-twice"),
        pytest.param(_set_pair(safetensors_size_bytes=0), "positive integer", id="size-zero"),
        pytest.param(_set_singleton("recipe", singleton_size_bytes=-3), "positive", id="size-neg"),
        pytest.param(
            _index(
                lambda rows: _pair_row(rows).update(
                    metadata_sha256=_pair_row(rows)["metadata_sha256"].upper()
                )
            ),
            "lowercase hex",
            id="digest-upper",
        ),
        pytest.param(
            _set_singleton("recipe", singleton_sha256="ab" * 31), "lowercase hex", id="digest-short"
        ),
    ],
)
def test_index_rules(builder, config, hooks, match):
    broken(builder, config, match, **hooks)


# --------------------------------------------------------------------------------------------
# Artifact manifest and the index's claims
# --------------------------------------------------------------------------------------------


Inventory = dict[str, Any]


def _retotal(inventory: Inventory) -> None:
    inventory["totals"] = {
        "objects": len(inventory["objects"]),
        "bytes": sum(item["bytes"] for item in inventory["objects"]),
    }


def _entry(inventory: Inventory, suffix: str) -> dict[str, Any]:
    return next(item for item in inventory["objects"] if item["uri"].endswith(suffix))


def _inventory(change: Callable[[Inventory], None]) -> dict[str, Any]:
    def hook(inventory: Inventory) -> None:
        change(inventory)
        _retotal(inventory)  # only the rule under test breaks

    return {"inventory_hook": hook}


def _totals(**changes: int) -> dict[str, Any]:
    def hook(inventory: Inventory) -> None:
        for key, delta in changes.items():
            inventory["totals"][key] += delta

    return {"inventory_hook": hook}


def _repeat_object(inventory: Inventory) -> None:
    inventory["objects"].append(dict(_entry(inventory, "recipe.json")))


def _unclaimed_object(inventory: Inventory) -> None:
    inventory["objects"].append(
        {
            "uri": "s3://syvain-data/elsewhere/notes.txt",
            "bytes": 3,
            "sha256": "cd" * 32,
            "role": "notes",
        }
    )


def _unlisted_object(inventory: Inventory) -> None:
    inventory["objects"].remove(_entry(inventory, "recipe.json"))


def _lists_itself(inventory: Inventory) -> None:
    recipe = _entry(inventory, "recipe.json")
    inventory["objects"].append(
        {**recipe, "uri": recipe["uri"].replace("recipe.json", "artifact-manifest-v2.json")}
    )


def _change_prepared(**changes: Any) -> dict[str, Any]:
    return _inventory(lambda inv: _entry(inv, "task-0000.safetensors").update(changes))


def _change_prepared_metadata(**changes: Any) -> dict[str, Any]:
    return _inventory(lambda inv: _entry(inv, "analysis-task-0000.parquet").update(changes))


def _declared_rows(delta: int) -> dict[str, Any]:
    def change(inventory: Inventory) -> None:
        for tensor in _entry(inventory, "analysis-task-0000.safetensors")["tensors"]:
            if tensor["name"] == "input_ids":
                tensor["shape"][0] += delta

    return _inventory(change)


def _no_row_tensor(inventory: Inventory) -> None:
    item = _entry(inventory, "analysis-task-0000.safetensors")
    item["tensors"] = [t for t in item["tensors"] if t["name"] != "input_ids"]


def _flip_byte(data: bytes, index: int = -2) -> bytes:
    changed = bytearray(data)
    changed[index] ^= 0x01
    return bytes(changed)


@pytest.mark.parametrize(
    ("hooks", "match"),
    [
        pytest.param(
            {
                "upload_hook": lambda objects: objects.update(
                    {
                        uri: _flip_byte(data)
                        for uri, data in objects.items()
                        if uri.endswith("artifact-manifest-v2.json")
                    }
                )
            },
            "artifact manifest's .* SHA-256",
            id="digest",
        ),
        pytest.param(
            {"inventory_bytes_hook": lambda data: json.dumps(json.loads(data), indent=1).encode()},
            "not canonical",
            id="not-canonical",
        ),
        pytest.param(
            {"inventory_bytes_hook": lambda data: data.rstrip(b"\n")}, "not canonical", id="newline"
        ),
        pytest.param(
            {
                "inventory_bytes_hook": lambda data: (
                    json.dumps(json.loads(data), sort_keys=True, separators=(",", ":")).encode()
                    + b"\n"
                )
            },
            "not canonical",
            id="ascii-escaped",
        ),
        pytest.param(
            _inventory(lambda inv: inv.update(schema="syvain-other-manifest-v2")),
            "schema is",
            id="schema",
        ),
        pytest.param(
            _inventory(lambda inv: inv.update(schema_version=3)), "schema_version", id="version"
        ),
        pytest.param(
            _inventory(lambda inv: inv.update(schema_version="2")),
            "schema_version",
            id="version-str",
        ),
        pytest.param(
            _inventory(lambda inv: inv.update(recipe_sha256="ef" * 32)),
            "recipe_sha256",
            id="recipe",
        ),
        pytest.param(_inventory(_repeat_object), "more than once", id="repeated-uri"),
        pytest.param(_totals(objects=1), "totals", id="totals-objects"),
        pytest.param(_totals(bytes=-1), "totals", id="totals-bytes"),
        pytest.param(_inventory(_unclaimed_object), "index does not claim", id="unclaimed"),
        pytest.param(_inventory(_unlisted_object), "inventory does not list", id="unlisted"),
        pytest.param(_inventory(_lists_itself), "lists itself", id="lists-itself"),
        pytest.param(_change_prepared(sha256="ee" * 32), "inventory .* SHA-256", id="claim-digest"),
        pytest.param(
            _change_prepared_metadata(bytes=123456), "inventory 123456 bytes", id="claim-size"
        ),
        pytest.param(
            _inventory(lambda inv: _entry(inv, "recipe.json").update(role="license")),
            "the inventory 'license'",
            id="singleton-role",
        ),
        # a pair's objects
        pytest.param(_change_prepared(role="representations"), "role, source, split", id="role"),
        pytest.param(
            _change_prepared_metadata(role="representation_metadata"),
            "role, source, split",
            id="metadata-role",
        ),
        pytest.param(_change_prepared(source="longmino"), "role, source, split", id="source"),
        pytest.param(
            _change_prepared_metadata(split="validation"), "role, source, split", id="split"
        ),
        pytest.param(_declared_rows(1), "rows; the index", id="tensor-rows"),
        pytest.param(_inventory(_no_row_tensor), "exactly one tensor 'input_ids'", id="no-tensor"),
        pytest.param(
            _inventory(
                lambda inv: _entry(inv, "analysis-task-0000.parquet")["parquet"].update(rows=7)
            ),
            "7 parquet rows",
            id="parquet-rows",
        ),
    ],
)
def test_artifact_manifest_rules(builder, config, hooks, match):
    broken(builder, config, match, **hooks)


def test_task_ids_come_from_file_names(builder, config):
    task = builder.task("validation", "common_pile", 1)
    task.representation_file = "projections.safetensors"
    broken(builder, config, "must be \\{task\\}/representations.safetensors")


def test_task_sets_must_be_equal(builder, config):
    builder.task("basis_fit", "dolmino", 0).representation_folder = "another-task"
    broken(builder, config, "task sets differ")


def test_prepared_task_id_is_the_file_name(builder, config):
    # Renaming the prepared file changes its task id: the sets differ.
    builder.task("analysis", "dolmino", 1).prepared_file = "renamed.safetensors"
    broken(builder, config, "only prepared: renamed")


# --------------------------------------------------------------------------------------------
# Prepared metadata and selection
# --------------------------------------------------------------------------------------------


def _selected(builder: PublicationBuilder, source: str = "dolmino") -> tuple[Task, Any]:
    """The first selected block of a source (and its task)."""
    return builder.candidates("analysis", source)[0]


def _prepared_rows(builder: PublicationBuilder) -> list[dict[str, Any]]:
    return _selected(builder)[0].prepared_rows


@pytest.mark.parametrize(
    ("change", "match"),
    [
        pytest.param(lambda rows: [r.pop("document_id") for r in rows], "columns", id="missing"),
        pytest.param(lambda rows: [r.update(extra=1) for r in rows], "columns", id="extra"),
        pytest.param(lambda rows: rows[1].update(block_index=5), "row 1: block_index", id="index"),
        pytest.param(
            lambda rows: rows[2].update(block_id=rows[2]["block_id"].upper()),
            "row 2: block_id",
            id="block-id",
        ),
        pytest.param(lambda rows: rows[0].update(source="common_pile"), "source", id="source"),
        pytest.param(lambda rows: rows[0].update(split="validation"), "split", id="split"),
        pytest.param(lambda rows: rows[1].update(token_offset=-1), "token_offset", id="token"),
        pytest.param(lambda rows: rows[0].update(projection_offset=64), "projection_off", id="64"),
        pytest.param(lambda rows: rows[0].update(projection_offset=-1), "projection_off", id="-1"),
        pytest.param(lambda rows: rows[0].update(token_offset=None), "nulls", id="null"),
    ],
)
def test_prepared_metadata_rules(builder, config, change, match):
    change(_prepared_rows(builder))
    broken(builder, config, match)


def test_repeated_block_id_within_a_source(builder, config):
    first = builder.task("analysis", "common_pile", 0)
    second = builder.task("analysis", "common_pile", 1)
    second.prepared_rows[0]["block_id"] = first.prepared_rows[0]["block_id"]
    broken(builder, config, "appears twice among the 'common_pile' candidates")


def test_block_selected_under_two_sources(builder, config):
    for source in ("dolmino", "common_pile"):
        builder.task("analysis", source, 1).prepared_rows[2]["block_id"] = "0" * 64
    broken(builder, config, "selected under both 'dolmino' and 'common_pile'")


def test_too_few_examples_is_value_error(builder, config):
    published = builder.publish(config)
    with pytest.raises(ValueError) as info:
        load(published, config, per_source_count=7)
    assert str(info.value) == "Source 'dolmino' has 6 'analysis' examples; requested 7"
    assert not isinstance(info.value, RepresentationIntegrityError)


def test_a_source_without_blocks_has_zero_examples(builder, config):
    published = builder.publish(config)
    with pytest.raises(ValueError, match="^Source 'longmino' has 0 'analysis' examples"):
        load(published, config, sources=["longmino"])


# --------------------------------------------------------------------------------------------
# Tensors
# --------------------------------------------------------------------------------------------


def _prepared_tensors(builder: PublicationBuilder) -> dict[str, np.ndarray]:
    return _selected(builder)[0].prepared_tensors


def _projection(builder: PublicationBuilder) -> dict[str, np.ndarray]:
    return _selected(builder)[0].representation_tensors


@pytest.mark.parametrize(
    ("change", "match"),
    [
        pytest.param(
            lambda t: t.update(extra=np.zeros(3, np.int8)), "tensors must be exactly", id="extra"
        ),
        pytest.param(lambda t: t.pop("qkv_start"), "tensors must be exactly", id="missing"),
        pytest.param(
            lambda t: t.update(input_ids=t["input_ids"].astype(np.int64)), "I32", id="ids-dtype"
        ),
        pytest.param(
            lambda t: t.update(input_ids=np.ascontiguousarray(t["input_ids"][:, :1024])),
            "I32",
            id="ids-shape",
        ),
        pytest.param(
            lambda t: t.update(projection_offset=t["projection_offset"].astype(np.int32)),
            "I16",
            id="offset-dtype",
        ),
        pytest.param(
            lambda t: t["projection_offset"].__setitem__(1, (t["projection_offset"][1] + 1) % 64),
            "projection_offset\\[1\\]",
            id="offset-values",
        ),
    ],
)
def test_prepared_tensor_rules(builder, config, change, match):
    change(_prepared_tensors(builder))
    broken(builder, config, match)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        pytest.param(
            lambda t: t.update(norm=np.zeros(len(t["projection"]), np.float16)),
            "exactly projection",
            id="extra",
        ),
        pytest.param(
            lambda t: t.update(projection=t["projection"].astype(np.float32)), "F16", id="dtype"
        ),
        pytest.param(
            lambda t: t.update(projection=np.ascontiguousarray(t["projection"][:, :128])),
            "F16",
            id="width",
        ),
        pytest.param(
            lambda t: t.update(projection=np.concatenate([t["projection"], t["projection"][:1]])),
            "rows",
            id="rows",
        ),
    ],
)
def test_projection_tensor_rules(builder, config, change, match):
    change(_projection(builder))
    broken(builder, config, match)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        pytest.param(lambda rows: [r.pop("block_type") for r in rows], "columns", id="missing"),
        pytest.param(lambda rows: [r.update(note="x") for r in rows], "columns", id="extra"),
        pytest.param(
            lambda rows: [r.update(layer=str(r["layer"])) for r in rows], "integer", id="type"
        ),
    ],
)
def test_representation_metadata_columns(builder, config, change, match):
    change(_selected(builder)[0].representation_rows)
    broken(builder, config, match)


def _relations(builder: PublicationBuilder) -> list[dict[str, Any]]:
    """The 32 representation rows of the first selected block at the requested layer/kind."""
    task, block = _selected(builder)
    return task.relation_rows(block.block_id, REQUEST["teacher_layer"], REQUEST["state_kind"])


def _extra_row(builder: PublicationBuilder) -> None:
    task, block = _selected(builder)
    other = task.relation_rows(block.block_id, 7, REQUEST["state_kind"])
    other[5]["layer"] = REQUEST["teacher_layer"]


def _shift_position(rows: list[dict[str, Any]]) -> None:
    row = rows[3]
    row["position_offset"] += 1
    row["token_offset"] += 1
    row["projected_position_id"] = hashlib.sha256(
        "syvain-olmo3-representation-calibration-v1:projected-position\0"
        f"{row['block_id']}\0{row['position_offset']}".encode()
    ).hexdigest()


def _non_finite(value: float) -> Callable[[PublicationBuilder], None]:
    def change(builder: PublicationBuilder) -> None:
        row = _relations(builder)[9]["projection_row"]
        _projection(builder)["projection"][row, 17] = value

    return change


@pytest.mark.parametrize(
    ("change", "match"),
    [
        pytest.param(lambda b: _relations(b)[4].update(layer=0), "has 31 rows", id="31-rows"),
        pytest.param(_extra_row, "has 33 rows", id="33-rows"),
        pytest.param(lambda b: _shift_position(_relations(b)), "position_offset", id="position"),
        pytest.param(lambda b: _relations(b)[0].update(source="common_pile"), "source", id="src"),
        pytest.param(lambda b: _relations(b)[1].update(split="basis_fit"), "split", id="split"),
        pytest.param(
            lambda b: _relations(b)[2].update(token_offset=_relations(b)[2]["token_offset"] + 64),
            "token_offset",
            id="token-offset",
        ),
        pytest.param(
            lambda b: _relations(b)[5].update(block_type="sliding_attention"),
            "block_type",
            id="block-type",
        ),
        pytest.param(
            lambda b: _relations(b)[6].update(projected_position_id=sha256(b"other")),
            "projected_position_id",
            id="position-id",
        ),
        pytest.param(
            lambda b: _relations(b)[7].update(projection_row=len(_projection(b)["projection"])),
            "outside",
            id="projection-row",
        ),
        pytest.param(_non_finite(float("nan")), "not finite", id="nan"),
        pytest.param(_non_finite(float("inf")), "not finite", id="inf"),
        pytest.param(_non_finite(float("-inf")), "not finite", id="-inf"),
    ],
)
def test_representation_row_rules(builder, config, change, match):
    change(builder)
    broken(builder, config, match)


def test_block_type_of_sliding_layers(builder, config):
    task, block = _selected(builder)
    task.relation_rows(block.block_id, 0, "residual_pre")[0]["block_type"] = "full_attention"
    broken(
        builder, config, "block_type", request={"teacher_layer": 0, "state_kind": "residual_pre"}
    )


def test_declared_shapes_must_be_the_files(builder, config):
    def hook(objects: dict[str, bytes]) -> None:
        # Same claims, other bytes: a file whose header disagrees with the inventory.
        task, _ = _selected(builder)
        from safetensors.numpy import save

        tensors = dict(task.prepared_tensors)
        tensors["qkv_start"] = np.zeros(len(tensors["qkv_start"]) + 1, np.int32)
        objects[task.prepared_uri] = save(tensors)

    broken(builder, config, "qkv_start has shape", objects_hook=hook)


def test_unreadable_safetensors(builder, config):
    task, _ = _selected(builder)
    broken(
        builder,
        config,
        "unreadable safetensors",
        objects_hook=lambda objects: objects.update({task.representation_uri: b"\xff" * 64}),
    )


# --------------------------------------------------------------------------------------------
# Custody: HEAD, streamed size and SHA-256
# --------------------------------------------------------------------------------------------


def _upload(change: Callable[[dict[str, bytes], Task], None]) -> Callable[[Any], Any]:
    return lambda builder: {"upload_hook": lambda objects: change(objects, _selected(builder)[0])}


@pytest.mark.parametrize(
    ("hooks", "match"),
    [
        pytest.param(
            _upload(lambda o, t: o.update({t.prepared_uri: _flip_byte(o[t.prepared_uri])})),
            "have SHA-256 .* claimed",
            id="tensor-digest",
        ),
        pytest.param(
            _upload(
                lambda o, t: o.update(
                    {t.representation_uri: _flip_byte(o[t.representation_uri], 100)}
                )
            ),
            "have SHA-256 .* claimed",
            id="representation-digest",
        ),
        pytest.param(
            _upload(
                lambda o, t: o.update(
                    {
                        u: _flip_byte(o[u], 10)
                        for u in [t.prepared_uri.replace("safetensors", "parquet")]
                    }
                )
            ),
            "have SHA-256 .* claimed",
            id="metadata-digest",
        ),
        pytest.param(
            _upload(lambda o, t: o.update({t.prepared_uri: o[t.prepared_uri] + b" "})),
            "bytes but .* claimed",
            id="size",
        ),
        pytest.param(
            _upload(lambda o, t: o.pop(t.representation_uri)), "does not exist", id="missing"
        ),
        pytest.param(
            _upload(
                lambda o, t: o.update({u: _flip_byte(o[u]) for u in o if u.endswith("recipe.json")})
            ),
            None,
            id="unread-singleton",
        ),
    ],
)
def test_custody_rules(builder, config, hooks, match):
    if match is None:  # the loader downloads only what it needs: a bad recipe.json is unseen
        published = builder.publish(config, **hooks(builder))
        assert_examples(load(published, config), builder)
        return
    broken(builder, config, match, **hooks(builder))


def test_store_errors_are_translated_only_when_they_are_about_the_data():
    uri = "s3://b/k"
    changed = pytest.raises(RepresentationIntegrityError, match="changed while it was read")
    with changed, custody_errors(uri):
        raise ObjectChangedError("etag")
    size = pytest.raises(RepresentationIntegrityError, match="^s3://b/k: size mismatch")
    with size, custody_errors(uri):
        raise ObjectDataError("size mismatch")
    shard = pytest.raises(RepresentationIntegrityError, match="^Unreadable parquet shard s3://b/k")
    with shard, custody_errors(uri):
        raise ShardDataError.of("parquet", uri, "declared 3 records but yielded 2")
    missing = pytest.raises(RepresentationIntegrityError, match="claims this object")
    with missing, custody_errors(uri):
        raise FileNotFoundError(uri)
    with pytest.raises(FileNotFoundError), custody_errors(uri, missing_is_integrity=False):
        raise FileNotFoundError(uri)
    kept_types = (PermissionError("no"), StorageRetryExhaustedError("later"), OSError("disk"))
    for kept in (*kept_types, RuntimeError("not a data error")):
        with pytest.raises(type(kept)), custody_errors(uri):
            raise kept


# --------------------------------------------------------------------------------------------
# The native download
# --------------------------------------------------------------------------------------------


@pytest.fixture
def blob(config, seaweed, s3_bucket, unique_prefix) -> tuple[str, bytes, str]:
    data = os.urandom(3 * 1024 * 1024 + 17)
    uri = f"s3://{s3_bucket}/{unique_prefix}/blob.bin"
    info = storage.put_object(uri, data, storage_config=config)
    return uri, data, info.etag


def test_download_object_hashes_while_streaming(blob, config, temp_dir):
    uri, data, etag = blob
    path = temp_dir / "out.bin"
    size, digest = _native.download_object(
        native_storage(config), uri, path, size_bytes=len(data), etag=etag
    )
    assert (size, digest) == (len(data), hashlib.sha256(data).hexdigest())
    assert path.read_bytes() == data
    path.unlink()


def test_download_object_local_store(tmp_path, temp_dir):
    source = tmp_path / "object.bin"
    source.write_bytes(b"x" * 5000)
    path = temp_dir / "out.bin"
    size, digest = _native.download_object(
        native_storage(StorageConfig()), f"file://{source}", path, size_bytes=5000
    )
    assert (size, digest) == (5000, hashlib.sha256(b"x" * 5000).hexdigest())
    path.unlink()


@pytest.mark.parametrize("delta", [-1, 1])
def test_failed_download_leaves_no_file(blob, config, temp_dir, delta):
    uri, data, etag = blob
    path = temp_dir / "out.bin"
    with pytest.raises(RuntimeError, match="size"):
        _native.download_object(
            native_storage(config), uri, path, size_bytes=len(data) + delta, etag=etag
        )
    assert not path.exists()


def test_download_of_a_missing_or_changed_object_leaves_no_file(blob, config, temp_dir):
    uri, data, _ = blob
    path = temp_dir / "out.bin"
    with pytest.raises(FileNotFoundError):
        _native.download_object(native_storage(config), uri + ".gone", path, size_bytes=10)
    with pytest.raises(ObjectChangedError):
        _native.download_object(
            native_storage(config), uri, path, size_bytes=len(data), etag='"0123456789"'
        )
    assert not path.exists()


def test_download_never_replaces_a_file(blob, config, temp_dir):
    uri, data, _ = blob
    path = temp_dir / "out.bin"
    path.write_bytes(b"mine")
    with pytest.raises(OSError, match="Cannot create"):
        _native.download_object(native_storage(config), uri, path, size_bytes=len(data))
    assert path.read_bytes() == b"mine"
    path.unlink()


def test_download_resumes_after_a_reset(blob, seaweed, fault_proxy, temp_dir):
    uri, data, etag = blob
    through_proxy = StorageConfig.create(
        s3_base_url=fault_proxy.endpoint,
        region=seaweed.region,
        access_key_id=seaweed.access_key_id,
        secret_access_key=seaweed.secret_access_key,
    )
    fault_proxy.script(reset_after(len(data) // 3, method="GET"))
    path = temp_dir / "out.bin"
    with storage_policy(backoff_base_s=0.01, backoff_cap_s=0.05):
        _, digest = _native.download_object(
            native_storage(through_proxy), uri, path, size_bytes=len(data), etag=etag
        )
    assert digest == hashlib.sha256(data).hexdigest()
    assert fault_proxy.faults_applied == 1
    path.unlink()


def test_a_cancelled_download_stops_and_leaves_no_file(blob, config, temp_dir):
    uri, data, _ = blob
    path = temp_dir / "out.bin"
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(InterruptedError, match="cancelled"):
        _native.download_object(
            native_storage(config), uri, path, size_bytes=len(data), cancel=cancel
        )
    assert not path.exists()


def test_closing_the_prefetcher_stops_a_stalled_download(blob, seaweed, fault_proxy, temp_dir):
    uri, data, _ = blob
    through_proxy = StorageConfig.create(
        s3_base_url=fault_proxy.endpoint,
        region=seaweed.region,
        access_key_id=seaweed.access_key_id,
        secret_access_key=seaweed.secret_access_key,
    )
    fault_proxy.script(stall_after(1000, 60.0, method="GET"))
    claim = Claim(uri, len(data), hashlib.sha256(data).hexdigest())
    with Workspace() as workspace:
        downloads = Prefetcher(workspace, through_proxy)
        downloads.plan([(claim, "blob")])
        deadline = time.monotonic() + 30
        while fault_proxy.faults_applied == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fault_proxy.faults_applied == 1
        started = time.monotonic()
        downloads.close()  # cancels the stalled download instead of waiting a minute
        assert time.monotonic() - started < 5
        assert os.listdir(workspace.path) == []


def test_workspace_names_files_uniquely_from_two_threads():
    # Two threads that both read the counter before either stores it would name one file twice;
    # the counter's addition waits for the other thread to make that interleaving happen.
    meet = threading.Barrier(2)

    class MeetingInt(int):
        def __add__(self, other: int) -> MeetingInt:
            # With the lock the other thread is kept out: the wait breaks, nothing to meet.
            with contextlib.suppress(threading.BrokenBarrierError):
                meet.wait(timeout=1)
            return MeetingInt(int(self) + other)

    with Workspace() as workspace:
        workspace._count = MeetingInt(0)
        names: list[Path] = []
        threads = [
            threading.Thread(target=lambda: names.append(workspace.new_path("s3://b/same")))
            for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(set(names)) == 2
