"""Stubs for the Rust extension `syvain_training_data._native` (checked by mypy.stubtest)."""

import builtins
import os
from collections.abc import Buffer, Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, final

READAHEAD_BYTES: int

@final
class NativeStorage:
    def __new__(
        cls,
        *,
        s3_base_url: str | None = None,
        region: str = ...,  # "us-east-1"
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        virtual_hosted_style_request: bool = False,
        skip_signature: bool = False,
        credential_provider: Callable[[], tuple[str, str, str | None, float | None]] | None = None,
        allow_http: bool = False,
        hf_token: str | None = None,
    ) -> NativeStorage: ...
    def get(self, uri: str) -> bytes: ...
    def head(self, uri: str) -> tuple[int, str]: ...
    def put(
        self,
        uri: str,
        data: bytes | Sequence[bytes],  # a sequence: chunks sent without being joined
        *,
        content_type: str | None = None,
        metadata: dict[str, str] | None = None,
        create_only: bool = False,
    ) -> tuple[int, str]: ...
    def delete(self, uri: str) -> None: ...
    def list(self, prefix_uri: str) -> list[tuple[str, int, str]]: ...
    def read_range(
        self, uri: str, size_bytes: int, *, start: int, end: int, etag: str | None = None
    ) -> bytes: ...
    def open_stream(
        self,
        uri: str,
        size_bytes: int,
        *,
        etag: str | None = None,
        start: int = 0,
        end: int | None = None,
        readahead_bytes: int | None = None,  # 64 KiB..=8 MiB ahead of the reader; None: 8 MiB
    ) -> ObjectStream: ...
    def open_shard(
        self,
        uri: str,
        data_format: str,
        *,
        size_bytes: int,
        records: int,
        etag: str | None = None,
        start: int = 0,
        stop: int | None = None,
        segment: tuple[int, int] | None = None,  # (byte_start, byte_end), read as a shard
        # jsonl.gz with segment: (member_start, unused_bits, window, skip, first_record,
        # first_line), the access point the segment starts at; records count in the shard
        entry: tuple[bool, int, bytes, int, int, int] | None = None,
        readahead_bytes: int | None = None,  # 64 KiB..=8 MiB ahead of the decoder; None: 8 MiB
    ) -> ShardReader: ...
    def open_shard_batches(
        self,
        uri: str,
        data_format: str,
        *,
        size_bytes: int,
        records: int,
        etag: str | None = None,
        start: int = 0,
        stop: int | None = None,
        columns: builtins.list[str] | None = None,
        batch_size: int,
        segment: tuple[int, int] | None = None,
        entry: tuple[bool, int, bytes, int, int, int] | None = None,
        readahead_bytes: int | None = None,  # as for open_shard
    ) -> ShardBatchReader: ...
    def open_parquet(
        self,
        uri: str,
        *,
        size_bytes: int,
        etag: str | None = None,
        start: int = 0,
        stop: int | None = None,  # None: every row group to the file's end
        columns: builtins.list[str] | None = None,
        batch_rows: int | None = None,
        max_batch_values: int,
    ) -> ParquetBatchReader: ...

@final
class ObjectStream:
    def read_chunk(self) -> bytes | None: ...
    def read(self, size: int = ...) -> bytes: ...  # -1: everything left
    def __iter__(self) -> Iterator[bytes]: ...
    def __next__(self) -> bytes: ...
    def close(self) -> None: ...
    def __enter__(self) -> ObjectStream: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
    @property
    def uri(self) -> str | None: ...
    @property
    def size(self) -> int | None: ...
    @property
    def position(self) -> int | None: ...
    @property
    def buffered_bytes(self) -> int | None: ...
    @property
    def resumes(self) -> int | None: ...

@final
class SlotStates:
    """Who owns each slot of a shared-memory ring: a 4-byte state word per slot at the start of
    ``memory`` (free, retired, or an owner generation and a phase: claimed, sent, lent), then a
    generation counter; slot ``i``'s bytes are ``slot_bytes`` from ``header + i * slot_bytes``.
    Every change is a compare-and-swap from the word the step before left."""

    def __new__(cls, memory: Buffer, slots: int, header: int, slot_bytes: int) -> SlotStates: ...
    def is_free(self, slot: int) -> bool: ...
    def claim(self, first: int, low: int, high: int) -> tuple[int, int] | None: ...
    def unclaim(self, slot: int, tag: int) -> bool: ...
    def send(self, slot: int, tag: int) -> bool: ...
    def lend(self, slot: int, tag: int, length: int) -> HeldSlot: ...
    def retire(self) -> None: ...
    @property
    def retired(self) -> bool: ...

@final
class HeldSlot:
    """A lent ring slot's batch bytes, without a copy (a writable byte buffer); the slot is
    freed (in a retired ring: its pages released) when this object is gone."""

    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __release_buffer__(self, buffer: memoryview, /) -> None: ...

@final
class StreamCounters:
    """Counts the streams this thread opens while it is entered (``with counters: ...``)."""

    def __new__(cls) -> StreamCounters: ...
    @staticmethod
    def entered() -> StreamCounters | None: ...
    def __enter__(self) -> StreamCounters: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
    @property
    def streams(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def retries(self) -> dict[str, int]: ...  # connection, timeout, status, ended_early, other

def set_storage_policy(
    *,
    max_attempts: int,
    window_s: float,
    backoff_base_s: float,
    backoff_cap_s: float,
    connect_timeout_s: float,
    read_inactivity_timeout_s: float,
    request_timeout_s: float,
    stream_response_deadline_s: float,
) -> None: ...
def get_storage_policy() -> dict[str, float]: ...

# rust/binding/src/order.rs: the epoch order's one generator (syvain_core::order), fixed
# forever for given arguments. interleave: sum(counts) u16 LE labels, label k counts[k] times,
# uniformly shuffled; spread: the same labels, each label's spread about evenly;
# permutation: range(count) permuted, as count i64 LE; unit_draws: count floats in [0, 1).
def interleave(counts: Sequence[int], seed: int) -> bytes: ...
def spread(counts: Sequence[int], seed: int) -> bytes: ...
def permutation(count: int, seed: int) -> bytes: ...
def unit_draws(count: int, seed: int) -> list[float]: ...

# rust/binding/src/token_rows.rs: token batches written in place (load_tokens).
def fill_token_rows(
    values: Any,
    bounds: Sequence[int],
    out: Any,
    seq_len: int,
    pad: int,
    eos: int | None = None,
) -> None: ...
def fill_mask_rows(mask: Any, bounds: Sequence[int], out: Any, seq_len: int, eos: bool) -> None: ...
def fill_positions(out: Any, starts: Sequence[int], firsts: Sequence[int]) -> None: ...

# rust/binding/src/upload.rs: streaming uploads for the saver.
SINGLE_PUT_MAX: int
MULTIPART_THRESHOLD: int
PART_SIZE: int

def put_file(
    storage: NativeStorage,
    uri: str,
    path: str | os.PathLike[str],
    *,
    content_type: str | None = None,
    metadata: dict[str, str] | None = None,
    create_only: bool = False,
    single_put_max: int = ...,
    multipart_threshold: int = ...,
    part_size: int = ...,
) -> tuple[int, str]: ...

# rust/binding/src/codec: shard readers and writers (SPEC section 3).
@final
class ShardReader:
    def next_batch(self, max_records: int = 1024) -> list[dict[str, Any]]: ...
    def __iter__(self) -> ShardReader: ...
    def __next__(self) -> dict[str, Any]: ...
    @property
    def records_yielded(self) -> int: ...
    @property
    def uri(self) -> str: ...
    @property
    def data_format(self) -> str: ...

@final
class GzipAccessPoints:
    """The access points of a jsonl.gz shard, every ``step`` records of each block of
    ``block`` records, built from its bytes fed in order (``formats.gzip_index``)."""

    def __new__(cls, uri: str, block: int, step: int) -> GzipAccessPoints: ...
    def feed(self, chunk: bytes | memoryview) -> None: ...
    def finish(self) -> None: ...
    # (start_bit, member_start, skip, first_record, first_line, end_byte, window)
    def take_entries(self) -> list[tuple[int, bool, int, int, int, int, bytes]]: ...
    @property
    def records(self) -> int: ...

@final
class ShardEncoder:
    def __new__(cls, data_format: str) -> ShardEncoder: ...
    def encode(self, records: Iterable[Mapping[Any, Any]]) -> bytes: ...
    def finish(self) -> bytes: ...
    @property
    def records(self) -> int: ...
    @property
    def bytes_written(self) -> int: ...
    @property
    def data_format(self) -> str: ...

def shard_reader_from_bytes(
    data_format: str,
    uri: str,
    data: bytes,
    declared_records: int,
    chunk_size: int | None = None,
    *,
    start: int = 0,
    stop: int | None = None,
) -> ShardReader: ...

# rust/binding/src/codec/shard_batches.rs: Arrow batches of msgpack.zstf and jsonl.gz shards.
BATCH_BYTES: int

@final
class ShardBatchReader:
    def __iter__(self) -> ShardBatchReader: ...
    def __next__(self) -> ShardBatch: ...
    @property
    def uri(self) -> str: ...
    @property
    def data_format(self) -> str: ...

@final
class ParquetBatchReader:
    def __iter__(self) -> ParquetBatchReader: ...
    def __next__(self) -> ShardBatch: ...
    @property
    def plain_schema(self) -> ShardBatch: ...  # an empty batch of the expanded columns
    @property
    def rows(self) -> int: ...  # as the footer declares them
    @property
    def paged(self) -> bool: ...
    @property
    def fetched(self) -> tuple[int, int]: ...  # (requests, bytes)

@final
class ShardBatch:
    @property
    def num_rows(self) -> int: ...
    @property
    def column_names(self) -> list[str]: ...
    def __len__(self) -> int: ...
    def __arrow_c_schema__(self) -> object: ...
    def __arrow_c_array__(
        self, requested_schema: object | None = None
    ) -> tuple[object, object]: ...
    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object: ...
    def int_list_buffers(self, column: str) -> tuple[IntBuffer, IntBuffer]: ...

def shard_batches_from_bytes(
    data_format: str,
    uri: str,
    data: bytes,
    declared_records: int,
    chunk_size: int | None = None,
    *,
    start: int = 0,
    stop: int | None = None,
    columns: list[str] | None = None,
    batch_size: int = 8192,
) -> ShardBatchReader: ...
def _decode_only(data_format: str, data: bytes) -> int:
    """Benchmark-only (benchmarks/tokens.py): decompresses and parses shard bytes, building
    nothing; returns the records found. Not part of the API."""

@final
class IntBuffer:
    """Read-only integers (int32 offsets or int64 values) through the buffer protocol."""

    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __release_buffer__(self, buffer: memoryview, /) -> None: ...

# rust/binding/src/rows: Parquet rows from Arrow record batches (SPEC section 3).

def rows_from_arrow(
    schema: object, array: object, fallback: Callable[[int], list[Any]]
) -> list[dict[str, Any]]: ...

# rust/binding/src/download.rs: an object streamed to a new local file, hashed on the way.

def download_object(
    storage: NativeStorage,
    uri: str,
    path: str | os.PathLike[str],
    *,
    size_bytes: int,
    etag: str | None = None,
    cancel: Any | None = None,  # anything with is_set(), e.g. threading.Event
) -> tuple[int, str]: ...
