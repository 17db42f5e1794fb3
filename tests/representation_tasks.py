"""The data of one task of the fixture publication (SPEC section 7), made in memory: its blocks,
prepared rows and tensors, representation rows for several layers and all three state kinds
(stored out of order), qkv relations, and the projections the loader must return.

:mod:`representation_fixture` serializes and uploads these tasks as a publication.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

STATE_KINDS = ("residual_pre", "post_attention", "post_mlp")
FULL_ATTENTION = {3, 7, 11, 15, 19, 23, 27, 31}
DOMAIN = "syvain-olmo3-representation-calibration-v1:projected-position"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def projected_position_id(block_id: str, position: int) -> str:
    return sha256(f"{DOMAIN}\0{block_id}\0{position}".encode())


def block_type(layer: int) -> str:
    return "full_attention" if layer in FULL_ATTENTION else "sliding_attention"


@dataclass
class Block:
    block_id: str
    row: int
    input_ids: np.ndarray
    token_offset: int
    projection_offset: int


@dataclass
class Task:
    """One task of a split and source: its three pairs, as data the tests may change."""

    split: str
    source: str
    name: str
    prefix: str
    blocks: list[Block]
    prepared_rows: list[dict[str, Any]]
    prepared_tensors: dict[str, np.ndarray]
    representation_rows: list[dict[str, Any]]
    representation_tensors: dict[str, np.ndarray]
    qkv_rows: list[dict[str, Any]]
    qkv_tensors: dict[str, np.ndarray]
    #: (block_id, layer, state_kind) -> (32, 256) float16 projections in position order.
    truth: dict[tuple[str, int, str], np.ndarray] = field(repr=False)
    #: File and folder names, changeable by tests (the task id comes from them).
    prepared_file: str = ""
    representation_folder: str = ""
    representation_file: str = "representations.safetensors"

    @property
    def prepared_uri(self) -> str:
        name = self.prepared_file or f"{self.name}.safetensors"
        return f"{self.prefix}final/prepared/{self.split}/{self.source}/{name}"

    @property
    def representation_uri(self) -> str:
        return (
            f"{self.prefix}final/representations/{self.split}/{self.source}/"
            f"{self.representation_folder or self.name}/{self.representation_file}"
        )

    @property
    def qkv_uri(self) -> str:
        return f"{self.prefix}final/qkv/{self.split}/{self.source}/{self.name}/qkv.safetensors"

    def relation_rows(self, block_id: str, layer: int, state_kind: str) -> list[dict[str, Any]]:
        """The representation rows of a block for (layer, state_kind), by position."""
        rows = [
            row
            for row in self.representation_rows
            if (row["block_id"], row["layer"], row["state_kind"]) == (block_id, layer, state_kind)
        ]
        return sorted(rows, key=lambda row: row["position_offset"])


def make_task(
    rng: np.random.Generator,
    recipe_sha256: str,
    prefix: str,
    layers: Sequence[int],
    split: str,
    source: str,
    name: str,
    count: int,
) -> Task:
    """A task of ``count`` blocks, its random data drawn from ``rng``."""
    ids = [sha256(f"{recipe_sha256}:{name}:{i}".encode()) for i in range(count)]
    input_ids = rng.integers(0, 100_352, (count, 2048), dtype=np.int32)
    token_offsets = rng.integers(0, 1_000_000, count)
    projection_offsets = rng.integers(0, 64, count)
    blocks = [
        Block(ids[i], i, input_ids[i], int(token_offsets[i]), int(projection_offsets[i]))
        for i in range(count)
    ]
    prepared_rows = [
        {
            "block_index": block.row,
            "block_id": block.block_id,
            "source": source,
            "split": split,
            "document_id": f"doc-{name}-{block.row}",
            "document_identity": sha256(f"doc:{block.block_id}".encode()),
            "text_identity": sha256(f"text:{block.block_id}".encode()),
            "raw_document_ids": [f"raw-{block.row}", f"raw-{block.row}-b"],
            "normalized_identity": sha256(f"norm:{block.block_id}".encode()),
            "family_identity": sha256(f"family:{block.block_id}".encode()),
            "split_identity": sha256(f"split:{block.block_id}".encode()),
            "split_identity_kind": "document",
            "source_uri": f"s3://upstream/{source}/{block.row}.jsonl.gz",
            "source_record_index": block.row,
            "token_offset": block.token_offset,
            "input_sha256": sha256(block.input_ids.tobytes()),
            "projection_offset": block.projection_offset,
            "qkv_layer": 3,
            "qkv_start": 0,
            "qkv_length": 2048,
        }
        for block in blocks
    ]
    prepared_tensors = {
        "input_ids": input_ids,
        "projection_offset": projection_offsets.astype(np.int16),
        "qkv_layer": np.full(count, 3, dtype=np.int16),
        "qkv_start": np.zeros(count, dtype=np.int32),
        "qkv_length": np.full(count, 2048, dtype=np.int32),
    }
    # Canonical order: block, layer, state kind, position; stored in two other orders.
    keys = [
        (block, layer, kind, i)
        for block in blocks
        for layer in layers
        for kind in STATE_KINDS
        for i in range(32)
    ]
    values = rng.standard_normal((len(keys), 256), dtype=np.float32).astype(np.float16)
    tensor_rows = rng.permutation(len(keys))
    projection = np.empty_like(values)
    projection[tensor_rows] = values
    truth = {}
    for start in range(0, len(keys), 32):
        block, layer, kind, _ = keys[start]
        truth[(block.block_id, layer, kind)] = values[start : start + 32]
    representation_rows = []
    for canonical in rng.permutation(len(keys)):
        block, layer, kind, i = keys[canonical]
        position = block.projection_offset + 64 * i
        representation_rows.append(
            {
                "projection_row": int(tensor_rows[canonical]),
                "projected_position_id": projected_position_id(block.block_id, position),
                "block_index": block.row,
                "block_id": block.block_id,
                "source": source,
                "split": split,
                "position_offset": position,
                "token_offset": block.token_offset + position,
                "layer": layer,
                "state_kind": kind,
                "block_type": block_type(layer),
            }
        )
    qkv_rows = [
        {"block_id": block.block_id, "block_index": block.row, "qkv_layer": 3} for block in blocks
    ]
    qkv_tensors = {"qkv_sketch": rng.standard_normal((count, 64)).astype(np.float16)}
    return Task(
        split=split,
        source=source,
        name=name,
        prefix=prefix,
        blocks=blocks,
        prepared_rows=prepared_rows,
        prepared_tensors=prepared_tensors,
        representation_rows=representation_rows,
        representation_tensors={"projection": projection},
        qkv_rows=qkv_rows,
        qkv_tensors=qkv_tensors,
        truth=truth,
    )
