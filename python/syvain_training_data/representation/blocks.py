"""Prepared blocks and their selection (SPEC section 7).

Everything in this module and in :mod:`.relations` and :mod:`.tensor_files` reads files the
custody layer has already downloaded and verified; they check the contents and copy out only
the selected rows. Here: the metadata tables (columns, types, row counts), the prepared
metadata's rows, and the choice of the first blocks by block_id per source.

Decision where the SPEC is silent: column lists are compared as sets (order free, no
repeats); the columns with rules must have an integer or string Arrow type and no nulls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from syvain_training_data.errors import RepresentationIntegrityError
from syvain_training_data.representation.custody import integrity_error
from syvain_training_data.representation.publication import Pair

__all__ = [
    "POSITIONS",
    "PREPARED_COLUMNS",
    "PreparedBlocks",
    "SelectedBlock",
    "open_table",
    "read_prepared_metadata",
    "select_blocks",
]

POSITIONS: Final = 32
POSITION_STRIDE: Final = 64

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


def open_table(path: Path, uri: str, columns: Sequence[str], rows: int, read: Sequence[str]) -> Any:
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
    table = open_table(path, uri, PREPARED_COLUMNS, pair.metadata_records, read)
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
