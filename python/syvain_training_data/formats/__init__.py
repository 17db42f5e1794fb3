"""The Python side of the shard formats: one descriptor per format (:mod:`.registry`), one
module per codec that is not native, and the one check of a format name.

msgpack.zstf and jsonl.gz are encoded and decoded in Rust (``syvain_training_data._native``);
:mod:`syvain_training_data.formats.parquet` goes through pyarrow (the ``parquet`` extra). Nothing
here imports an optional dependency until a format module is used.
"""

from __future__ import annotations

from syvain_training_data.formats.registry import (
    FORMATS,
    ShardFormat,
    check_data_format,
    shard_format,
)

__all__ = ["FORMATS", "ShardFormat", "check_data_format", "shard_format"]
