"""A small, complete OLMo 3 representation publication (SPEC section 7), written to a store.

``PublicationBuilder`` makes the data of every task in memory (``representation_tasks``:
prepared blocks, representation rows for several layers and all three state kinds, stored out
of order, qkv relations), then ``publish`` serializes it (safetensors, parquet, the artifact
manifest, the three index shards, the data manifest) and uploads it at the canonical path of a
fresh random recipe. Tests break exactly one rule by changing the tasks before ``publish`` or
through its hooks, which see each layer of the chain in order:

``objects_hook(objects)``            artifact bytes by URI, before anything claims them
``inventory_hook(inventory)``        the artifact manifest as a dict
``inventory_bytes_hook(data)``       its bytes (the index claims what this returns)
``index_hook(rows_by_split)``        the index rows (dicts) of each split
``upload_hook(objects)``             every object about to be uploaded, by URI (claims are fixed)
``manifest_hook(manifest)``          the data manifest as a dict
``manifest_bytes_hook(data)``        its bytes (``Published.manifest_sha256`` is of these)

``expected(...)`` computes what the loader must return straight from the builder's data.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from safetensors.numpy import save as save_safetensors

from representation_tasks import Block, Task, make_task, sha256
from syvain_training_data import storage
from syvain_training_data.manifest import canonical_manifest_bytes, validate_manifest
from syvain_training_data.storage import StorageConfig

SPLITS = ("basis_fit", "analysis", "validation")
ROOT = "s3://syvain-data/shared-data/distill-olmo3-representation-v1"
SCHEMA = "syvain-distill-olmo3-representation-artifact-manifest-v2"

INDEX_TYPES: dict[str, pa.DataType] = {
    "entry_kind": pa.string(),
    "role": pa.string(),
    "source": pa.string(),
    "split": pa.string(),
    "safetensors_uri": pa.string(),
    "safetensors_size_bytes": pa.int64(),
    "safetensors_sha256": pa.string(),
    "metadata_uri": pa.string(),
    "metadata_size_bytes": pa.int64(),
    "metadata_sha256": pa.string(),
    "tensor_offset": pa.int64(),
    "tensor_records": pa.int64(),
    "tensor_total_records": pa.int64(),
    "metadata_offset": pa.int64(),
    "metadata_records": pa.int64(),
    "metadata_total_records": pa.int64(),
    "singleton_uri": pa.string(),
    "singleton_size_bytes": pa.int64(),
    "singleton_sha256": pa.string(),
}
PAIR_FIELDS = list(INDEX_TYPES)[4:16]
SINGLETON_FIELDS = list(INDEX_TYPES)[16:]


def parquet_bytes(rows: list[dict[str, Any]], schema: pa.Schema | None = None) -> bytes:
    if schema is None:
        table = pa.Table.from_pylist(rows)
    else:
        try:
            table = pa.Table.from_pylist(rows, schema=schema)
        except (pa.ArrowException, TypeError, ValueError):
            table = pa.Table.from_pylist(rows)  # a test changed a value's type
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


@dataclass
class Published:
    manifest_uri: str
    manifest_sha256: str
    prefix: str
    recipe_sha256: str
    #: Every uploaded object by URI, as uploaded.
    objects: dict[str, bytes]


@dataclass
class Expected:
    block_id: str
    source: str
    split: str
    input_ids: np.ndarray
    relation_positions: np.ndarray
    projections: np.ndarray


Hook = Callable[[Any], Any]


class PublicationBuilder:
    """Builds the publication's data; see the module docs."""

    def __init__(
        self,
        *,
        sources: Sequence[str] = ("common_pile", "dolmino"),
        tasks_per_source: int = 2,
        blocks_per_task: int | Mapping[str, int] = 3,
        layers: Sequence[int] = (0, 3, 7),
        seed: int | None = None,
        recipe_sha256: str | None = None,
    ) -> None:
        self.recipe_sha256 = recipe_sha256 or os.urandom(32).hex()
        self.prefix = f"{ROOT}/{self.recipe_sha256}/publication-v2/"
        self.manifest_uri = f"{self.prefix}data-manifest-v1.json"
        self.layers = tuple(layers)
        self.rng = np.random.default_rng(seed)
        self.tasks: list[Task] = []
        for split in SPLITS:
            count = blocks_per_task if isinstance(blocks_per_task, int) else blocks_per_task[split]
            for source in sources:
                for number in range(tasks_per_source):
                    name = f"{source}-{split}-task-{number:04d}"
                    self.tasks.append(
                        make_task(
                            self.rng,
                            self.recipe_sha256,
                            self.prefix,
                            self.layers,
                            split,
                            source,
                            name,
                            count,
                        )
                    )
        #: Extra singleton artifacts: URI -> (role, bytes).
        self.singletons: dict[str, tuple[str, bytes]] = {
            f"{self.prefix}recipe.json": ("recipe", b'{"recipe":"olmo3-test"}\n'),
        }

    def task(self, split: str, source: str, number: int = 0) -> Task:
        return [t for t in self.tasks if t.split == split and t.source == source][number]

    def candidates(self, split: str, source: str) -> list[tuple[Task, Block]]:
        """A source's blocks in a split, by block_id."""
        found = [
            (task, block)
            for task in self.tasks
            if task.split == split and task.source == source
            for block in task.blocks
        ]
        return sorted(found, key=lambda item: item[1].block_id)

    def expected(
        self, split: str, sources: Sequence[str], count: int, layer: int, state_kind: str
    ) -> list[Expected]:
        result = []
        for source in sources:
            for task, block in self.candidates(split, source)[:count]:
                result.append(
                    Expected(
                        block_id=block.block_id,
                        source=source,
                        split=split,
                        input_ids=block.input_ids.astype(np.int64),
                        relation_positions=block.projection_offset + 64 * np.arange(32),
                        projections=task.truth[(block.block_id, layer, state_kind)],
                    )
                )
        return result

    # -- serialization ------------------------------------------------------------------------

    def _pairs(self) -> list[tuple[Task, str, str, dict[str, np.ndarray], list[dict[str, Any]]]]:
        pairs = []
        for task in self.tasks:
            pairs.append(
                (
                    task,
                    "prepared_blocks",
                    task.prepared_uri,
                    task.prepared_tensors,
                    task.prepared_rows,
                )
            )
            pairs.append(
                (
                    task,
                    "representations",
                    task.representation_uri,
                    task.representation_tensors,
                    task.representation_rows,
                )
            )
            pairs.append((task, "qkv_relations", task.qkv_uri, task.qkv_tensors, task.qkv_rows))
        return pairs

    def publish(
        self,
        storage_config: StorageConfig,
        *,
        objects_hook: Hook | None = None,
        inventory_hook: Hook | None = None,
        inventory_bytes_hook: Hook | None = None,
        index_hook: Hook | None = None,
        upload_hook: Hook | None = None,
        manifest_hook: Hook | None = None,
        manifest_bytes_hook: Hook | None = None,
    ) -> Published:
        metadata_roles = {
            "prepared_blocks": "prepared_metadata",
            "representations": "representation_metadata",
            "qkv_relations": "qkv_metadata",
        }
        objects: dict[str, bytes] = {}
        entries: dict[str, dict[str, Any]] = {}
        pair_rows: dict[str, list[dict[str, Any]]] = {split: [] for split in SPLITS}
        for task, role, uri, tensors, rows in self._pairs():
            metadata_uri = uri.removesuffix(".safetensors") + ".parquet"
            objects[uri] = save_safetensors(tensors)
            objects[metadata_uri] = parquet_bytes(rows)
            common = {"source": task.source, "split": task.split}
            entries[uri] = {
                "role": role,
                **common,
                "tensors": [
                    {"name": name, "shape": list(array.shape), "dtype": str(array.dtype)}
                    for name, array in sorted(tensors.items())
                ],
            }
            entries[metadata_uri] = {
                "role": metadata_roles[role],
                **common,
                "parquet": {"rows": len(rows), "columns": list(rows[0]) if rows else []},
            }
            first_tensor = {
                "prepared_blocks": "input_ids",
                "representations": "projection",
                "qkv_relations": "qkv_sketch",
            }[role]
            pair_rows[task.split].append(
                {
                    "entry_kind": "paired_artifact",
                    "role": role,
                    "source": task.source,
                    "split": task.split,
                    "safetensors_uri": uri,
                    "metadata_uri": metadata_uri,
                    "tensor_offset": 0,
                    "tensor_records": len(tensors[first_tensor]),
                    "tensor_total_records": len(tensors[first_tensor]),
                    "metadata_offset": 0,
                    "metadata_records": len(rows),
                    "metadata_total_records": len(rows),
                    "singleton_uri": None,
                    "singleton_size_bytes": None,
                    "singleton_sha256": None,
                }
            )
        for uri, (role, data) in self.singletons.items():
            objects[uri] = data
            entries[uri] = {"role": role}
        if objects_hook is not None:
            objects_hook(objects)
        inventory_objects = [
            {"uri": uri, "bytes": len(objects[uri]), "sha256": sha256(objects[uri]), **entry}
            for uri, entry in sorted(entries.items())
        ]
        inventory = {
            "schema": SCHEMA,
            "schema_version": 2,
            "recipe_sha256": self.recipe_sha256,
            "description": "OLMo 3 représentation — fixture",  # a key the SPEC does not name
            "objects": inventory_objects,
            "totals": {
                "objects": len(inventory_objects),
                "bytes": sum(item["bytes"] for item in inventory_objects),
            },
        }
        if inventory_hook is not None:
            inventory_hook(inventory)
        inventory_data = (
            json.dumps(inventory, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n"
        ).encode()
        if inventory_bytes_hook is not None:
            inventory_data = inventory_bytes_hook(inventory_data)
        artifact_manifest_uri = f"{self.prefix}artifact-manifest-v2.json"
        objects[artifact_manifest_uri] = inventory_data

        def claims(row: dict[str, Any]) -> dict[str, Any]:
            tensor, metadata = objects[row["safetensors_uri"]], objects[row["metadata_uri"]]
            return {
                **row,
                "safetensors_size_bytes": len(tensor),
                "safetensors_sha256": sha256(tensor),
                "metadata_size_bytes": len(metadata),
                "metadata_sha256": sha256(metadata),
            }

        rows_by_split = {split: [claims(row) for row in pair_rows[split]] for split in SPLITS}
        singleton_roles = {artifact_manifest_uri: "artifact_manifest"}
        singleton_roles.update((uri, role) for uri, (role, _) in self.singletons.items())
        for uri, role in singleton_roles.items():
            rows_by_split["analysis"].append(
                {
                    "entry_kind": "singleton_artifact",
                    "role": role,
                    "source": "__publication__",
                    "split": "analysis",
                    **dict.fromkeys(PAIR_FIELDS),
                    "singleton_uri": uri,
                    "singleton_size_bytes": len(objects[uri]),
                    "singleton_sha256": sha256(objects[uri]),
                }
            )
        for split in SPLITS:  # the SPEC's column order
            rows_by_split[split] = [
                {name: row[name] for name in INDEX_TYPES} for row in rows_by_split[split]
            ]
        if index_hook is not None:
            index_hook(rows_by_split)
        index_objects = {}
        for split, rows in rows_by_split.items():
            names = list(rows[0]) if rows else list(INDEX_TYPES)
            schema = pa.schema(
                [(name, INDEX_TYPES.get(name) or pa.infer_type([rows[0][name]])) for name in names]
            )
            index_objects[f"{self.prefix}final/index/{split}.parquet"] = parquet_bytes(rows, schema)
        objects.update(index_objects)
        if upload_hook is not None:
            upload_hook(objects)
        etags = {}
        for uri, data in objects.items():
            info = storage.put_object(uri, data, storage_config=storage_config)
            etags[uri] = info.etag
        manifest = {
            "version": 1,
            "data_format": "parquet",
            "splits": {
                split: {
                    "records": len(rows_by_split[split]),
                    "shards": [
                        {
                            "uri": uri,
                            "records": len(rows_by_split[split]),
                            "size_bytes": len(index_objects[uri]),
                            "etag": etags.get(uri, ""),
                        }
                    ],
                    "curriculum": {},
                }
                for split in SPLITS
                for uri in [f"{self.prefix}final/index/{split}.parquet"]
            },
        }
        if manifest_hook is not None:
            manifest_hook(manifest)
        try:
            manifest_data = canonical_manifest_bytes(validate_manifest(manifest))
        except (TypeError, ValueError):
            manifest_data = (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode()
        if manifest_bytes_hook is not None:
            manifest_data = manifest_bytes_hook(manifest_data)
        storage.put_object(self.manifest_uri, manifest_data, storage_config=storage_config)
        objects[self.manifest_uri] = manifest_data
        return Published(
            manifest_uri=self.manifest_uri,
            manifest_sha256=sha256(manifest_data),
            prefix=self.prefix,
            recipe_sha256=self.recipe_sha256,
            objects=objects,
        )
