"""The Python side of the shard formats, one module per format.

msgpack.zstf and jsonl.gz are encoded and decoded in Rust (``syvain_training_data._native``);
:mod:`syvain_training_data.formats.parquet` goes through pyarrow (the ``parquet`` extra). Nothing
here imports an optional dependency until a format module is used.
"""
