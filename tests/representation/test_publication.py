"""The chain of custody above the tensors (``representation/publication.py``): the data
manifest, the index shards and the artifact manifest, and the index's claims against it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from representation_helpers import FAKE_URI, REQUEST, _flip_byte, broken, load
from syvain_training_data import RepresentationIntegrityError, storage
from syvain_training_data.representation import iter_representation_examples

pytestmark = pytest.mark.timeout(300)


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


def test_missing_manifest_is_file_not_found(config):
    generator = iter_representation_examples(FAKE_URI, "ab" * 32, storage_config=config, **REQUEST)
    with pytest.raises(FileNotFoundError):
        next(generator)


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
