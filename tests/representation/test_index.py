"""The data manifest and the index shards (``representation/index.py``): the manifest's rules,
the HEAD, size, etag and row-count checks of each shard, and the rules of every index row.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from representation_helpers import FAKE_URI, REQUEST, broken, load
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


def _append_to_pair(name: str, suffix: str) -> dict[str, Any]:
    return _index(lambda rows: _pair_row(rows).update({name: _pair_row(rows)[name] + suffix}))


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
            _append_to_pair("safetensors_uri", ".bin"),
            "does not end in .safetensors",
            id="tensor-uri",
        ),
        pytest.param(_append_to_pair("metadata_uri", ".gz"), "with .parquet", id="metadata-uri"),
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
