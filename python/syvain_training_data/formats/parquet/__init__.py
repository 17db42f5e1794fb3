"""Parquet shards through pyarrow (SPEC section 3; needs the ``parquet`` extra).

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
    data, whichever comes first. Memory stays bounded by one row group whatever the shard size
    (the spool takes about the shard's uncompressed Arrow size on disk, in the temp directory:
    set ``TMPDIR`` to move it); the spool is removed however the call ends. Identical records
    give identical bytes (the file holds no timestamp; ``created_by`` names the pyarrow
    version).

Reader (:func:`iter_parquet_shard`, :func:`iter_parquet_batches`, :mod:`.reader`)
    An object in a store is read in place (:mod:`.ranged_file`): one HEAD (its size checked),
    then one ranged GET per read pyarrow makes, the footer first, then the column chunks of
    the row groups and columns it decodes, each resumable and pinned to one etag; nothing is
    downloaded whole or written to disk, and row groups before ``start``, after ``stop`` or
    columns not selected are not fetched. A file:// shard is read in place, if it is a regular
    file (a FIFO or device is an OSError, never a hang): its size is checked before the first
    row and its size and etag again after the last. Rows ``[start, stop)`` skip the row
    groups before ``start`` without decoding them. pyarrow then decodes batches of
    about 1 MiB of column data (1 Ki to 64 Ki rows) in a helper thread, at most two ahead, while
    the reading thread turns the current one into rows 1024 at a time; the rows are built in
    Rust from the Arrow buffers (``_native.rows_from_arrow``) with exactly the values
    ``pyarrow.Table.to_pylist`` gives, in file order, never more than the manifest's
    ``records``. Memory stays bounded by a few decoded batches plus pyarrow's buffers for one
    row group, whatever the file declares: top-level byte-array columns stay dictionary-encoded
    while pyarrow decodes, and each batch is handed on in pieces of at most 64 MiB of values
    (a row over 1 GiB is an error), so a few KiB of dictionary references cannot expand to
    gigabytes at once (:mod:`.bounds`).

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
