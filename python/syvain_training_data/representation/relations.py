"""The representation rows of the selected blocks (SPEC section 7): each block's 32 relation
positions at the requested teacher layer and state kind, and the projection rows holding them.

All selected blocks of one task are checked at once on whole Arrow columns; only when that
fails are the rows looked at one by one, to name the first failing block and rule.

Decision where the SPEC is silent: a representation row belongs to a block by its
``block_id`` (``block_index`` is not compared: the SPEC does not define it for representation
rows).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from syvain_training_data.representation.blocks import POSITIONS, SelectedBlock, open_table
from syvain_training_data.representation.custody import integrity_error
from syvain_training_data.representation.publication import Pair

__all__ = [
    "FULL_ATTENTION_LAYERS",
    "REPRESENTATION_COLUMNS",
    "Relations",
    "projected_position_id",
    "read_relation_rows",
]

FULL_ATTENTION_LAYERS: Final = frozenset({3, 7, 11, 15, 19, 23, 27, 31})
PROJECTED_POSITION_DOMAIN: Final = "syvain-olmo3-representation-calibration-v1:projected-position"
REPRESENTATION_COLUMNS: Final = (
    "projection_row",
    "projected_position_id",
    "block_index",
    "block_id",
    "source",
    "split",
    "position_offset",
    "token_offset",
    "layer",
    "state_kind",
    "block_type",
)


def projected_position_id(block_id: str, position: int) -> str:
    """The SHA-256 hex id of a block's projected position."""
    text = f"{PROJECTED_POSITION_DOMAIN}\0{block_id}\0{position}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def block_type(layer: int) -> str:
    return "full_attention" if layer in FULL_ATTENTION_LAYERS else "sliding_attention"


@dataclass(frozen=True)
class Relations:
    """A block's 32 relation positions and the projection rows holding them, in order."""

    positions: list[int]
    projection_rows: list[int]


def read_relation_rows(
    path: Path,
    pair: Pair,
    selected: Sequence[SelectedBlock],
    teacher_layer: int,
    state_kind: str,
    projection_rows: int,
) -> dict[str, Relations]:
    """Checks a representation metadata table and, for each selected block (all of one task),
    its 32 rows for (teacher_layer, state_kind). Raises RepresentationIntegrityError."""
    uri = pair.metadata.uri
    columns = REPRESENTATION_COLUMNS
    table = open_table(path, uri, columns, pair.metadata_records, columns)
    if table.num_rows != projection_rows:
        integrity_error(
            uri, f"the table has {table.num_rows} rows but {pair.tensor.uri} {projection_rows}"
        )
    ids = pa.array([block.block_id for block in selected], type=pa.string())
    mask = pc.and_(
        pc.and_(
            pc.is_in(table.column("block_id"), value_set=ids),
            pc.equal(table.column("layer"), teacher_layer),
        ),
        pc.equal(table.column("state_kind"), state_kind),
    )
    rows = table.filter(mask)
    relations = _relations_at_once(rows, ids, pair, selected, teacher_layer, projection_rows)
    if relations is not None:
        return relations
    # Something is wrong: find and name the first failing block, row by row.
    rows_of: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows.to_pylist():
        rows_of[row["block_id"]].append(row)
    for block in selected:
        _check_relations(
            uri,
            block,
            rows_of.get(block.block_id, []),
            pair,
            teacher_layer,
            state_kind,
            projection_rows,
        )
    integrity_error(uri, "the representation rows of the selected blocks are inconsistent")


def _relations_at_once(
    rows: Any,
    ids: Any,
    pair: Pair,
    selected: Sequence[SelectedBlock],
    teacher_layer: int,
    projection_rows: int,
) -> dict[str, Relations] | None:
    """The rules of :func:`_check_relations` for all selected blocks at once, on whole columns;
    None when any of them fails (the caller then looks row by row, to name the failure).

    The rows are those of the selected blocks at (teacher_layer, state_kind); all selected
    blocks of one task share the task's source and split."""
    count = len(selected)
    if rows.num_rows != POSITIONS * count or any(
        rows.column(name).null_count for name in rows.column_names
    ):
        return None
    block = np.asarray(pc.index_in(rows.column("block_id"), value_set=ids).to_numpy())
    position = np.asarray(rows.column("position_offset").to_numpy(), dtype=np.int64)
    if np.bincount(block, minlength=count).tolist() != [POSITIONS] * count:
        return None
    order = np.lexsort((position, block))  # by block, then by position
    expected = np.asarray([b.positions for b in selected], dtype=np.int64)  # (count, 32)
    token_base = np.asarray([b.token_offset for b in selected], dtype=np.int64)[:, None]
    taken = rows.take(pa.array(order))

    def column(name: str) -> np.ndarray[Any, Any]:
        return np.asarray(taken.column(name).to_numpy(zero_copy_only=False))

    projection_row = column("projection_row").astype(np.int64).reshape(count, POSITIONS)
    position_ids = [projected_position_id(b.block_id, p) for b in selected for p in b.positions]
    if not (
        np.array_equal(position[order].reshape(count, POSITIONS), expected)
        and np.array_equal(column("token_offset").reshape(count, POSITIONS), token_base + expected)
        and bool(pc.all(pc.equal(taken.column("source"), selected[0].source)).as_py())
        and bool(pc.all(pc.equal(taken.column("split"), pair.split)).as_py())
        and bool(pc.all(pc.equal(taken.column("block_type"), block_type(teacher_layer))).as_py())
        and taken.column("projected_position_id").to_pylist() == position_ids
        and bool(((projection_row >= 0) & (projection_row < projection_rows)).all())
    ):
        return None
    return {
        b.block_id: Relations(positions=b.positions, projection_rows=projection_row[i].tolist())
        for i, b in enumerate(selected)
    }


def _check_relations(
    uri: str,
    block: SelectedBlock,
    rows: list[dict[str, Any]],
    pair: Pair,
    teacher_layer: int,
    state_kind: str,
    projection_rows: int,
) -> Relations:
    where = f"block {block.block_id} (layer {teacher_layer}, {state_kind})"
    if len(rows) != POSITIONS:
        integrity_error(uri, f"{where} has {len(rows)} rows; exactly {POSITIONS} are required")
    if any(type(row["position_offset"]) is not int for row in rows):
        integrity_error(uri, f"{where} has a null position_offset")
    rows.sort(key=lambda row: row["position_offset"])
    expected_type = block_type(teacher_layer)
    for row, position in zip(rows, block.positions, strict=True):
        expected = {
            "block_id": block.block_id,
            "source": block.source,
            "split": pair.split,
            "position_offset": position,
            "token_offset": block.token_offset + position,
            "layer": teacher_layer,
            "state_kind": state_kind,
            "block_type": expected_type,
            "projected_position_id": projected_position_id(block.block_id, position),
        }
        for name, value in expected.items():
            if row[name] != value:
                integrity_error(
                    uri,
                    f"{where}, position {position}: {name} is {row[name]!r}, expected {value!r}",
                )
        projection_row = row["projection_row"]
        if type(projection_row) is not int or not 0 <= projection_row < projection_rows:
            integrity_error(
                uri,
                f"{where}, position {position}: projection_row {projection_row!r} is outside "
                f"the {projection_rows} rows of {pair.tensor.uri}",
            )
    return Relations(
        positions=block.positions, projection_rows=[int(row["projection_row"]) for row in rows]
    )
