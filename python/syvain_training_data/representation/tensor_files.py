"""The safetensors files of a pair (SPEC section 7): prepared input_ids and teacher projections.

Each file's tensor names, dtypes and shapes are checked (and must equal the shapes the artifact
manifest declares), then only the selected rows are copied out. Tensors are read through
safetensors (as numpy arrays) in windows of at most ``WINDOW_BYTES`` and the selected rows are
gathered into fresh arrays that become the examples' tensors without another copy, so no
mapping of the file outlives the read and memory stays bounded by a window plus the selected
rows. numpy rather than torch does the gathering: torch's intra-op thread pool is slower by
orders of magnitude on busy cores, and the loader must not change the caller's torch settings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn, cast

import numpy as np
import torch
from safetensors import safe_open

from syvain_training_data.errors import RepresentationIntegrityError
from syvain_training_data.representation.blocks import PreparedBlocks
from syvain_training_data.representation.custody import integrity_error
from syvain_training_data.representation.publication import Pair
from syvain_training_data.representation.relations import Relations

__all__ = [
    "BLOCK_TOKENS",
    "PROJECTION_WIDTH",
    "ProjectionFile",
    "read_input_ids",
    "read_projections",
]

BLOCK_TOKENS: Final = 2048
PROJECTION_WIDTH: Final = 256
#: Tensor rows are read this many bytes at a time at most.
WINDOW_BYTES: Final = 8 * 1024 * 1024
PREPARED_TENSORS: Final = frozenset(
    {"input_ids", "projection_offset", "qkv_layer", "qkv_length", "qkv_start"}
)


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
