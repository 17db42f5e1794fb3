"""The Python side of the shard formats, one module per format, and the one check of a
format name.

msgpack.zstf and jsonl.gz are encoded and decoded in Rust (``syvain_training_data._native``);
:mod:`syvain_training_data.formats.parquet` goes through pyarrow (the ``parquet`` extra). Nothing
here imports an optional dependency until a format module is used.
"""

from __future__ import annotations

from syvain_training_data.manifest import DATA_FORMATS

__all__ = ["check_data_format"]


def check_data_format(data_format: object) -> None:
    """ValueError unless ``data_format`` is one of the manifest's data formats (SPEC section 2),
    naming them."""
    if data_format not in DATA_FORMATS:
        raise ValueError(
            f"Unknown data format {data_format!r}; expected one of {', '.join(DATA_FORMATS)}"
        )
