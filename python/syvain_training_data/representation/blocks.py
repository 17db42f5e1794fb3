"""Prepared blocks, their selection, and the join to teacher projections (SPEC section 7).

Everything here reads files the custody layer has already downloaded and verified; it checks
the contents (metadata columns and rows, tensor names, dtypes and shapes, the 32 relation rows
of every selected block) and copies out only the selected rows. Tensors are read through
safetensors (as numpy arrays) in windows of at most ``WINDOW_BYTES`` and the selected rows are
gathered into fresh arrays that become the examples' tensors without another copy, so no
mapping of the file outlives the read and memory stays bounded by a window plus the selected
rows. numpy rather than torch does the gathering: torch's intra-op thread pool is slower by
orders of magnitude on busy cores, and the loader must not change the caller's torch settings.

Decisions where the SPEC is silent:

- Column lists are compared as sets (order free, no repeats); the columns with rules must have
  an integer or string Arrow type and no nulls.
- A representation row belongs to a block by its ``block_id`` (``block_index`` is not
  compared: the SPEC does not define it for representation rows).
- The shapes the artifact manifest declares for a downloaded tensor file must be its actual
  shapes.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NoReturn, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from safetensors import safe_open

from syvain_training_data.errors import RepresentationIntegrityError
from syvain_training_data.representation.custody import integrity_error
from syvain_training_data.representation.publication import Pair

__all__ = [
    "BLOCK_TOKENS",
    "FULL_ATTENTION_LAYERS",
    "POSITIONS",
    "PREPARED_COLUMNS",
    "PROJECTION_WIDTH",
    "REPRESENTATION_COLUMNS",
    "PreparedBlocks",
    "SelectedBlock",
    "projected_position_id",
    "read_input_ids",
    "read_prepared_metadata",
    "read_projections",
    "read_relation_rows",
    "select_blocks",
]

BLOCK_TOKENS: Final = 2048
PROJECTION_WIDTH: Final = 256
POSITIONS: Final = 32
POSITION_STRIDE: Final = 64
FULL_ATTENTION_LAYERS: Final = frozenset({3, 7, 11, 15, 19, 23, 27, 31})
PROJECTED_POSITION_DOMAIN: Final = "syvain-olmo3-representation-calibration-v1:projected-position"
#: Tensor rows are read this many bytes at a time at most.
WINDOW_BYTES: Final = 8 * 1024 * 1024

PREPARED_COLUMNS: Final = (
    "block_index",
    "block_id",
    "source",
    "split",
    "document_id",
    "document_identity",
    "text_identity",
    "raw_document_ids",
    "normalized_identity",
    "family_identity",
    "split_identity",
    "split_identity_kind",
    "source_uri",
    "source_record_index",
    "token_offset",
    "input_sha256",
    "projection_offset",
    "qkv_layer",
    "qkv_start",
    "qkv_length",
)
PREPARED_TENSORS: Final = frozenset(
    {"input_ids", "projection_offset", "qkv_layer", "qkv_length", "qkv_start"}
)
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
_INTEGER_COLUMNS: Final = frozenset(
    {
        "block_index",
        "token_offset",
        "projection_offset",
        "projection_row",
        "position_offset",
        "layer",
    }
)
_STRING_COLUMNS: Final = frozenset(
    {"block_id", "source", "split", "projected_position_id", "state_kind", "block_type"}
)


def projected_position_id(block_id: str, position: int) -> str:
    """The SHA-256 hex id of a block's projected position."""
    text = f"{PROJECTED_POSITION_DOMAIN}\0{block_id}\0{position}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def block_type(layer: int) -> str:
    return "full_attention" if layer in FULL_ATTENTION_LAYERS else "sliding_attention"


# --------------------------------------------------------------------------------------------
# Metadata tables
# --------------------------------------------------------------------------------------------


def _open_table(
    path: Path, uri: str, columns: Sequence[str], rows: int, read: Sequence[str]
) -> Any:
    """The ``read`` columns of a metadata table after its column-set and row-count checks."""
    try:
        parquet = pq.ParquetFile(path)
        names = parquet.schema_arrow.names
        found = parquet.metadata.num_rows
    except Exception as error:
        raise RepresentationIntegrityError(f"{uri}: unreadable parquet: {error}") from error
    if sorted(names) != sorted(columns):
        missing = sorted(set(columns) - set(names))
        extra = sorted(set(names) - set(columns)) or sorted(
            name for name in set(names) if names.count(name) > 1
        )
        integrity_error(
            uri,
            f"columns must be exactly {', '.join(columns)} (missing: {', '.join(missing) or '-'};"
            f" unexpected or repeated: {', '.join(extra) or '-'})",
        )
    if found != rows:
        integrity_error(uri, f"the table has {found} rows; the publication claims {rows}")
    try:
        with parquet:
            # One thread: pyarrow's pool only adds contention next to the downloads.
            table = parquet.read(columns=list(read), use_threads=False)
    except Exception as error:
        raise RepresentationIntegrityError(f"{uri}: unreadable parquet: {error}") from error
    for name in read:
        column = table.column(name)
        if name in _INTEGER_COLUMNS and not pa.types.is_integer(column.type):
            integrity_error(uri, f"column {name} has type {column.type}, not an integer type")
        if name in _STRING_COLUMNS and not (
            pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
        ):
            integrity_error(uri, f"column {name} has type {column.type}, not a string type")
    return table


def _first_false(mask: Any) -> int | None:
    """The first row where a boolean Arrow array is false or null, or None."""
    values = np.asarray(mask.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)
    bad = np.flatnonzero(~values)
    return int(bad[0]) if bad.size else None


def _integers(table: Any, name: str, uri: str) -> np.ndarray[Any, np.dtype[np.int64]]:
    column = table.column(name)
    if column.null_count:
        integrity_error(uri, f"column {name} has nulls (row {_first_false(pc.is_valid(column))})")
    return np.asarray(column.to_numpy(), dtype=np.int64)


@dataclass(frozen=True)
class PreparedBlocks:
    """The checked metadata of one prepared-blocks pair: row i is block i."""

    pair: Pair
    block_ids: list[str]
    token_offsets: np.ndarray[Any, np.dtype[np.int64]]
    projection_offsets: np.ndarray[Any, np.dtype[np.int64]]


def read_prepared_metadata(path: Path, pair: Pair) -> PreparedBlocks:
    """Checks a prepared metadata table (columns exactly PREPARED_COLUMNS; row i has
    block_index i, a SHA-256 hex block_id, the pair's source and split, token_offset >= 0,
    0 <= projection_offset < 64). Raises RepresentationIntegrityError."""
    uri = pair.metadata.uri
    read = ("block_index", "block_id", "source", "split", "token_offset", "projection_offset")
    table = _open_table(path, uri, PREPARED_COLUMNS, pair.metadata_records, read)
    rows = table.num_rows

    def require(mask: Any, rule: str) -> None:
        bad = _first_false(mask)
        if bad is not None:
            integrity_error(uri, f"row {bad}: {rule}")

    block_index = _integers(table, "block_index", uri)
    require(pa.array(block_index == np.arange(rows)), "block_index must equal the row number")
    require(
        pc.match_substring_regex(table.column("block_id"), "^[0-9a-f]{64}$"),
        "block_id must be a lowercase hex SHA-256",
    )
    require(pc.equal(table.column("source"), pair.source), f"source must be {pair.source!r}")
    require(pc.equal(table.column("split"), pair.split), f"split must be {pair.split!r}")
    token_offsets = _integers(table, "token_offset", uri)
    require(pa.array(token_offsets >= 0), "token_offset must be >= 0")
    projection_offsets = _integers(table, "projection_offset", uri)
    require(
        pa.array((projection_offsets >= 0) & (projection_offsets < POSITION_STRIDE)),
        "projection_offset must be in [0, 64)",
    )
    return PreparedBlocks(
        pair=pair,
        block_ids=table.column("block_id").to_pylist(),
        token_offsets=token_offsets,
        projection_offsets=projection_offsets,
    )


# --------------------------------------------------------------------------------------------
# Selection
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SelectedBlock:
    """A selected block: its id, source, prepared pair and row there."""

    block_id: str
    source: str
    blocks: PreparedBlocks
    row: int

    @property
    def token_offset(self) -> int:
        return int(self.blocks.token_offsets[self.row])

    @property
    def projection_offset(self) -> int:
        return int(self.blocks.projection_offsets[self.row])

    @property
    def positions(self) -> list[int]:
        """The 32 relation positions p_i = projection_offset + 64 i."""
        return [self.projection_offset + POSITION_STRIDE * i for i in range(POSITIONS)]


def select_blocks(
    split: str,
    sources: Sequence[str],
    per_source_count: int,
    prepared: Mapping[str, Sequence[PreparedBlocks]],
) -> dict[str, list[SelectedBlock]]:
    """Per source, the first ``per_source_count`` candidates by block_id.

    Raises:
        RepresentationIntegrityError: a block_id repeats among a source's candidates, or a
            block is selected under two sources.
        ValueError: "Source 'x' has N 'split' examples; requested K".
    """
    selection: dict[str, list[SelectedBlock]] = {}
    selected_under: dict[str, str] = {}
    for source in sources:
        candidates = sorted(
            (block_id, index, row)
            for index, blocks in enumerate(prepared[source])
            for row, block_id in enumerate(blocks.block_ids)
        )
        for (first, a, _), (second, b, _) in zip(candidates, candidates[1:], strict=False):
            if first == second:
                where = prepared[source][a].pair.metadata.uri
                other = prepared[source][b].pair.metadata.uri
                integrity_error(
                    where,
                    f"block_id {first} appears twice among the {source!r} candidates "
                    f"(also in {other})",
                )
        if len(candidates) < per_source_count:
            raise ValueError(
                f"Source '{source}' has {len(candidates)} '{split}' examples; "
                f"requested {per_source_count}"
            )
        chosen = []
        for block_id, index, row in candidates[:per_source_count]:
            if block_id in selected_under:
                integrity_error(
                    prepared[source][index].pair.metadata.uri,
                    f"block_id {block_id} is selected under both {selected_under[block_id]!r} "
                    f"and {source!r}",
                )
            selected_under[block_id] = source
            chosen.append(SelectedBlock(block_id, source, prepared[source][index], row))
        selection[source] = chosen
    return selection


# --------------------------------------------------------------------------------------------
# Tensors
# --------------------------------------------------------------------------------------------


class _TensorFile:
    """A verified safetensors file, opened for slicing; errors name the URI."""

    def __init__(self, path: Path, uri: str, declared: Mapping[str, tuple[int, ...]]) -> None:
        self.uri = uri
        try:
            self._file = cast(Any, safe_open(str(path), framework="numpy"))
            self.names = set(self._file.keys())
            self._slices: dict[str, Any] = {name: self._file.get_slice(name) for name in self.names}
            self.shapes = {name: tuple(s.get_shape()) for name, s in self._slices.items()}
            self.dtypes = {name: s.get_dtype() for name, s in self._slices.items()}
        except Exception as error:
            raise RepresentationIntegrityError(f"{uri}: unreadable safetensors: {error}") from error
        for name, shape in declared.items():
            if self.shapes.get(name) != shape:
                integrity_error(
                    uri,
                    f"tensor {name} has shape {list(self.shapes.get(name, ()))} in the file but "
                    f"{list(shape)} in the artifact manifest",
                )

    def fail(self, message: str) -> NoReturn:
        integrity_error(self.uri, message)

    def require_names(self, names: frozenset[str]) -> None:
        if self.names != names:
            self.fail(
                f"tensors must be exactly {', '.join(sorted(names))}, found "
                f"{', '.join(sorted(self.names)) or 'none'}"
            )

    def require(self, name: str, dtype: str, shape: tuple[int, ...]) -> None:
        if self.dtypes[name] != dtype or self.shapes[name] != shape:
            self.fail(
                f"tensor {name} must be {dtype} {list(shape)}, found {self.dtypes[name]} "
                f"{list(self.shapes[name])}"
            )

    def whole(self, name: str) -> np.ndarray[Any, Any]:
        try:
            return np.array(self._slices[name][:])
        except Exception as error:
            raise RepresentationIntegrityError(
                f"{self.uri}: cannot read {name}: {error}"
            ) from error

    def rows(self, name: str, rows: np.ndarray[Any, np.dtype[np.int64]]) -> np.ndarray[Any, Any]:
        """Rows ``rows`` (sorted, unique) of a 2-D tensor as a new array, read in windows."""
        tensor = self._slices[name]
        shape = self.shapes[name]
        row_bytes = max(1, int(np.prod(shape[1:])) * _itemsize(self.dtypes[name]))
        window = max(1, WINDOW_BYTES // row_bytes)
        parts = []
        start_at = 0
        try:
            while start_at < len(rows):
                start = int(rows[start_at])
                end_at = int(np.searchsorted(rows, start + window, side="left"))
                stop = int(rows[end_at - 1]) + 1
                piece = tensor[start:stop]
                parts.append(np.take(piece, rows[start_at:end_at] - start, axis=0))
                del piece
                start_at = end_at
        except Exception as error:
            raise RepresentationIntegrityError(
                f"{self.uri}: cannot read {name}: {error}"
            ) from error
        return np.concatenate(parts) if len(parts) != 1 else parts[0]

    def close(self) -> None:
        self._slices.clear()
        del self._file


def _itemsize(dtype: str) -> int:
    return {"F16": 2, "BF16": 2, "I16": 2, "U16": 2, "F32": 4, "I32": 4, "U32": 4}.get(dtype, 8)


def read_input_ids(
    path: Path, blocks: PreparedBlocks, rows: Sequence[int]
) -> dict[int, torch.Tensor]:
    """Checks a prepared tensor file and returns the selected rows' input_ids as int64 (2048,)
    tensors of their own, by row. Raises RepresentationIntegrityError."""
    pair = blocks.pair
    count = len(blocks.block_ids)
    file = _TensorFile(path, pair.tensor.uri, pair.declared_shapes)
    try:
        file.require_names(PREPARED_TENSORS)
        file.require("input_ids", "I32", (count, BLOCK_TOKENS))
        file.require("projection_offset", "I16", (count,))
        offsets = file.whole("projection_offset").astype(np.int64)
        bad = np.flatnonzero(offsets != blocks.projection_offsets)
        if bad.size:
            file.fail(
                f"projection_offset[{bad[0]}] is {offsets[bad[0]]} but the metadata "
                f"{pair.metadata.uri} says {blocks.projection_offsets[bad[0]]}"
            )
        wanted = np.unique(np.asarray(rows, dtype=np.int64))
        gathered = file.rows("input_ids", wanted)
    finally:
        file.close()
    # Each example gets an array of its own (astype copies), handed to torch without a copy.
    return {
        int(row): torch.from_numpy(gathered[index].astype(np.int64))
        for index, row in enumerate(wanted.tolist())
    }


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
    table = _open_table(path, uri, columns, pair.metadata_records, columns)
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


class ProjectionFile:
    """A representation tensor file, checked: only ``projection``, float16 (rows, 256)."""

    def __init__(self, path: Path, pair: Pair) -> None:
        self._file = _TensorFile(path, pair.tensor.uri, pair.declared_shapes)
        try:
            self._file.require_names(frozenset({"projection"}))
            shape = self._file.shapes["projection"]
            self._file.require("projection", "F16", (shape[0] if shape else -1, PROJECTION_WIDTH))
            if shape[0] != pair.metadata_records:
                self._file.fail(
                    f"projection has {shape[0]} rows but {pair.metadata.uri} has "
                    f"{pair.metadata_records}"
                )
        except BaseException:
            self._file.close()
            raise
        self.rows = shape[0]

    def close(self) -> None:
        self._file.close()

    def read(self, relations: Mapping[str, Relations]) -> dict[str, torch.Tensor]:
        """Each block's (32, 256) float16 projections in position order, as tensors of their
        own; every value must be finite."""
        wanted = np.unique(
            np.asarray(
                [row for rel in relations.values() for row in rel.projection_rows], dtype=np.int64
            )
        )
        gathered = self._file.rows("projection", wanted)
        result = {}
        for block_id, rel in relations.items():
            values = np.take(gathered, np.searchsorted(wanted, rel.projection_rows), axis=0)
            finite = np.isfinite(values).all(axis=1)
            if not finite.all():
                bad = int(np.flatnonzero(~finite)[0])
                integrity_error(
                    self._file.uri,
                    f"block {block_id}: projection row {rel.projection_rows[bad]} (position "
                    f"{rel.positions[bad]}) holds a value that is not finite",
                )
            result[block_id] = torch.from_numpy(values)
        return result


def read_projections(
    path: Path, pair: Pair, relations: Mapping[str, Relations]
) -> dict[str, torch.Tensor]:
    """Checks a representation tensor file and returns each block's projections."""
    file = ProjectionFile(path, pair)
    try:
        return file.read(relations)
    finally:
        file.close()
