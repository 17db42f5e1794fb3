"""Parquet shards: written by pyarrow, read by arrow-rs in Rust and handed over as pyarrow
batches (SPEC section 3; needs the ``parquet`` extra).

Writer (:func:`write_parquet_shard`, :mod:`.writer`)
    Records become Arrow record batches of 1024 rows. Columns are the records' keys in the order
    they are first seen across the whole shard; a key a record lacks is null. Arrow infers each
    batch's column types, and the schemas of all batches are unified with permissive promotion
    (``pa.unify_schemas(..., promote_options="permissive")``: int64 then double gives double,
    null then string gives string, struct fields are merged). A Parquet writer needs its schema
    before the first row, so the batches are first spooled to Arrow IPC streams in a temporary
    directory (a new stream whenever the batch schema changes); once every record has been seen,
    the unified schema is known and the spooled batches are read back one at a time, promoted to
    it and written as zstd-compressed row groups, each closed at 64 Ki rows or 64 MiB of Arrow
    data, whichever comes first, in pages of about 256 KiB of plain values (no dictionary pages)
    with a CRC-32 each and an offset index, so a reader can enter a row group by page. Memory
    stays bounded by one row group whatever the shard size (the spool takes about the shard's
    uncompressed Arrow size on disk, in the temp directory: set ``TMPDIR`` to move it); the
    spool is removed however the call ends. Identical records give identical bytes (the file
    holds no timestamp; ``created_by`` names the pyarrow version).

Reader (:func:`iter_parquet_shard`, :func:`iter_parquet_batches`, :mod:`.reader`)
    A shard is read in place by the native arrow-rs reader (``rust/core/src/codec/
    parquet_read.rs``): its last 16 KiB first (the footer and page index of most shards; a
    larger footer costs one more read of exactly its size), then only the pages of the rows
    and columns read, adjacent ones in one ranged GET, each pinned to one etag and resumable;
    nothing is downloaded whole or written to disk. Row groups outside ``[start, stop)`` and
    columns not selected are never fetched; inside a row group, where the file has an offset
    index (the writer above adds one), only the pages the rows fall in. Page CRC-32s are
    checked where the writer set them (ours does). A file:// shard must be a regular file (a
    FIFO or device is an OSError, never a hang): its size is checked before the first row and
    its size and etag again after the last. Batches of about 1 MiB of column data (1 Ki to
    64 Ki rows) are decoded in a helper thread with the GIL released, at most two ahead,
    while the reading thread turns the current one into rows 1024 at a time; the rows are
    built in Rust from the Arrow buffers (``_native.rows_from_arrow``) with exactly the
    values ``pyarrow.Table.to_pylist`` gives, in file order, never more than the manifest's
    ``records``. Memory stays bounded by a few decoded batches plus one row group's selected
    pages, whatever the file declares: top-level byte-array columns the file
    dictionary-encodes stay dictionary-encoded while they are decoded, and each batch is
    handed on in pieces of at most 64 MiB of values (a row over 1 GiB is an error), so a few
    KiB of dictionary references cannot expand to gigabytes at once (:mod:`.bounds`).

Nothing here imports pyarrow until a shard is written or read (:mod:`.extra`).
"""

from syvain_training_data.formats.parquet.reader import iter_parquet_batches, iter_parquet_shard
from syvain_training_data.formats.parquet.writer import ParquetWriteResult, write_parquet_shard

__all__ = [
    "ParquetWriteResult",
    "iter_parquet_batches",
    "iter_parquet_shard",
    "write_parquet_shard",
]
