"""`DatasetSaver`: idempotent publication of a dataset from many processes (SPEC section 5).

A saver writes shards next to a manifest and, last, the manifest itself::

    saver = client.dataset_saver("s3://bucket/datasets/x/data-manifest.json")
    saver.save("train", None, records, shard_id="train-00000")   # in any process
    saver.commit_manifest()                                       # once, in the parent

Layout (``{base}`` is the manifest's parent prefix + ``/shards``)::

    {base}/{split}/part-{uuid4 hex}{suffix}                             no shard_id
    {base}/{split}/curriculum/{stage}/part-{uuid4 hex}{suffix}
    {base}/by-manifest/{sha256 of the manifest key}/{split}/part-{shard_id}{suffix}
    {base}/by-manifest/{...}/{split}/curriculum/{stage}/part-{shard_id}{suffix}
    {shard_uri}.metadata.json                                           completion descriptor

Each segment is stripped of surrounding whitespace, must be non-empty, and is percent-encoded
keeping only ASCII letters, digits and ``-_.=+`` (UTF-8 bytes as ``%XX``, upper-case hex).

Decisions taken where SPEC is silent:

- **The manifest key** hashed for ``by-manifest`` is the object key: for ``s3://b/k`` it is
  ``k``; for ``file:///abs/path`` it is ``abs/path`` (the path without its leading ``/``, the key
  the local directory store uses).
- **Names keep their whitespace.** Stripping applies to URI segments only; the manifest and the
  descriptor hold the split and stage names as given. Segments that encode to ``.`` or ``..``
  are rejected (they would name another directory).
- **Shards from other processes.** A deterministic shard (with ``shard_id``) is found by
  ``commit_manifest`` from its completion descriptor, listed under the ``by-manifest`` prefix,
  whichever process or machine saved it, including earlier runs of the same job. A shard
  without ``shard_id`` is recorded, after its data object, at
  ``{base}/by-manifest/{sha}/saver-sessions/{session}/part-{uuid}.saved.json`` (descriptor
  bytes), where ``session`` is a uuid4 hex drawn when the saver is created and shared by its
  pickled copies: a later saver instance has another session and never publishes them.
- **Found shards are verified.** Every descriptor found in the store passes the checks of
  ``recover`` (data object present, size, etag or sha256); a tampered one anywhere under the
  manifest fails the commit with PublicationConflictError rather than being skipped.
- **Local etags.** A ``file://`` object's etag (inode and mtime) does not survive cp, rsync or
  a restore, so manifests and descriptors record ``""`` for it, and one an older saver recorded
  is not enforced: its size and sha256 guard it (SPEC section 4).
- **Expected shards.** ``expect_shards(split, stage, shard_ids)`` states the complete set of
  deterministic shards of one split and stage; the commit then refuses (ValueError naming them)
  when any is missing or when another deterministic shard was found there.
- **Descriptors are canonical.** A descriptor whose bytes are not exactly the canonical bytes
  of its own content is a PublicationConflictError (SPEC fixes those bytes).
- **Uploads.** Encoded chunks are kept in memory up to ``spill_bytes`` (64 MiB), then the shard
  continues in a temporary file (``syvain-shard-*`` in the system temp directory), removed
  however ``save`` ends (a SIGKILL can leave one behind). A shard in memory is uploaded from its
  chunks without joining them; a file-backed one by the native ``put_file``: one PUT (create-only
  for deterministic shards), or, above 64 MiB for shards without ``shard_id``, a streamed
  multipart upload. Deterministic parquet and msgpack.zstf shards must be smaller than 5 GiB so
  one create-only PUT can write them. **Limitation:** a deterministic jsonl.gz shard of 5 GiB or
  more goes up as a multipart upload after a HEAD that finds no object (the store client has no
  create-only multipart completion); two writers racing on the same shard inside that window
  both write. Identical bytes are harmless; differing bytes are caught by the descriptor and
  etag checks (PublicationConflictError), not prevented.
- The saver is safe to use from several threads; pickled copies share nothing but the store.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
import string
import tempfile
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any, Final, cast

from pydantic import TypeAdapter, ValidationError

from syvain_training_data import _native
from syvain_training_data.errors import PublicationConflictError
from syvain_training_data.manifest import (
    DATA_FORMATS,
    DataManifest,
    DataManifestDataFormat,
    JsonObject,
    ManifestShard,
    canonical_manifest_bytes,
    parse_manifest,
)
from syvain_training_data.storage import (
    StorageConfig,
    get_object,
    head_object,
    list_objects,
    native_storage,
    open_stream,
    put_object,
)
from syvain_training_data.uris import (
    check_shard_scheme,
    file_path,
    portable_etag,
    s3_bucket_key,
    scheme_of,
)

__all__ = ["DESCRIPTOR_SCHEMA", "DatasetSaver", "copy_shard", "descriptor_bytes", "encode_segment"]

logger = logging.getLogger(__name__)

DESCRIPTOR_SCHEMA: Final = "syvain-training-data-shard-v1"
DESCRIPTOR_SUFFIX: Final = ".metadata.json"
SESSION_RECORD_SUFFIX: Final = ".saved.json"
SESSIONS_SEGMENT: Final = "saver-sessions"

SUFFIXES: Final[dict[str, str]] = {
    "jsonl.gz": ".jsonl.gz",
    "parquet": ".parquet",
    "msgpack.zstf": ".msgpack.zstf",
}
# SPEC section 4: content type and (content-format, compression) metadata per format.
OBJECT_ATTRIBUTES: Final[dict[str, tuple[str, dict[str, str]]]] = {
    "jsonl.gz": ("application/gzip", {"content-format": "jsonl", "compression": "gzip"}),
    "parquet": (
        "application/vnd.apache.parquet",
        {"content-format": "parquet", "compression": "zstd"},
    ),
    "msgpack.zstf": (
        "application/msgpack",
        {"content-format": "msgpack.zstf", "compression": "zstd-framed"},
    ),
}
_SINGLE_PUT_FORMATS: Final = ("parquet", "msgpack.zstf")
_SAFE_CHARS: Final = frozenset(string.ascii_letters + string.digits + "-_.=+")
_DESCRIPTOR_KEYS: Final = frozenset(
    {"curriculum_metadata", "curriculum_stage", "data_format", "schema", "sha256", "shard", "split"}
)
_SHARD_KEYS: Final = frozenset({"etag", "records", "size_bytes", "uri"})
_HEX: Final = frozenset("0123456789abcdef")
# Records per ShardEncoder.encode call. The encoder compresses one call's batch on its own
# thread while the next is serialized, so small batches keep both cores busy from a shard's first
# records to its last (msgpack.zstf encoding of 5000 text records: 1024 per call 0.50 s, 256 per
# call 0.38 s); below ~128 the per-call cost starts to show on small records.
_BATCH_RECORDS: Final = 256
_HASH_CHUNK: Final = 8 * 1024 * 1024
_SCAN_THREADS: Final = 16

_metadata_adapter: TypeAdapter[dict[str, Any]] = TypeAdapter(JsonObject)


@dataclass
class _Limits:
    """Size rules; the testing seam ``size_limits`` lowers them."""

    deterministic_single_put_bytes: int = _native.SINGLE_PUT_MAX
    spill_bytes: int = 64 * 1024 * 1024
    multipart_threshold: int = _native.MULTIPART_THRESHOLD
    part_size: int = _native.PART_SIZE


_limits = _Limits()


@contextlib.contextmanager
def size_limits(**overrides: int) -> Iterator[_Limits]:
    """Testing seam: lowers the 5 GiB rule (``deterministic_single_put_bytes``), the in-memory
    spool (``spill_bytes``) and the multipart sizes for the duration of a ``with`` block, in this
    process. Not for production use."""
    global _limits
    previous = _limits
    _limits = _Limits(**{**previous.__dict__, **overrides})
    try:
        yield _limits
    finally:
        _limits = previous


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET: Final = _Unset()


# --------------------------------------------------------------------------------------------
# Layout and descriptor bytes
# --------------------------------------------------------------------------------------------


def encode_segment(value: str, what: str = "path segment") -> str:
    """Strips ``value`` and percent-encodes it, keeping ASCII letters, digits and ``-_.=+``.

    Raises TypeError for a non-str, ValueError for an empty (after stripping), ``.`` or ``..``
    segment or one with a lone surrogate.
    """
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    stripped = value.strip()
    if not stripped:
        raise ValueError(f"{what} must be non-empty (after stripping whitespace), got {value!r}")
    try:
        encoded = "".join(
            char if char in _SAFE_CHARS else "".join(f"%{b:02X}" for b in char.encode("utf-8"))
            for char in stripped
        )
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not encodable as UTF-8: {value!r}") from None
    if encoded in (".", ".."):
        raise ValueError(f"{what} may not be {encoded!r}")
    return encoded


def _canonical_json(value: object) -> str:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def descriptor_bytes(
    *,
    shard: ManifestShard,
    data_format: str,
    split: str,
    curriculum_stage: str | None,
    curriculum_metadata: Mapping[str, Any] | None,
    sha256: str,
) -> bytes:
    """The completion descriptor of SPEC section 5: sorted keys, separators ``(",", ":")``,
    ASCII-escaped, plus ``"\\n"``."""
    document = {
        "curriculum_metadata": curriculum_metadata,
        "curriculum_stage": curriculum_stage,
        "data_format": data_format,
        "schema": DESCRIPTOR_SCHEMA,
        "sha256": sha256,
        "shard": {
            "etag": shard.etag,
            "records": shard.records,
            "size_bytes": shard.size_bytes,
            "uri": shard.uri,
        },
        "split": split,
    }
    return (_canonical_json(document) + "\n").encode("ascii")


def _manifest_key(manifest_uri: str) -> str:
    try:
        if scheme_of(manifest_uri) == "s3":
            return s3_bucket_key(manifest_uri)[1]
        return file_path(manifest_uri)[1:]
    except ValueError:
        raise ValueError(
            f"manifest_uri must be s3://bucket/key or file:///absolute/path, got {manifest_uri!r}"
        ) from None


def _validate_metadata(metadata: object) -> str | None:
    """Canonical JSON text of the metadata (None stays None); ValueError if not a JSON object."""
    if metadata is None:
        return None
    try:
        validated = _metadata_adapter.validate_python(metadata, strict=True)
    except ValidationError as error:
        raise ValueError(f"curriculum_metadata must be a JSON object: {error}") from error
    return _canonical_json(validated)


def _loads_descriptor(data: bytes, uri: str) -> Any:
    def reject(token: str) -> object:
        raise ValueError(f"{token} is not JSON")

    try:
        return json.loads(data.decode("ascii"), parse_constant=reject)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise PublicationConflictError(
            f"Completion descriptor {uri} is not valid ASCII JSON: {error}"
        ) from error


@dataclass(frozen=True)
class _Saved:
    """A shard known to this saver: what the manifest says about it."""

    split: str
    stage: str | None
    metadata: str | None  # canonical JSON text of the curriculum metadata
    shard: ManifestShard
    deterministic: bool


# --------------------------------------------------------------------------------------------
# Spooling encoded bytes
# --------------------------------------------------------------------------------------------


class _Spool:
    """Encoded shard bytes, each byte held once: in memory up to ``spill_bytes``, then in a
    temporary file. Hashes as it goes. ``close`` removes the file."""

    def __init__(self, spill_bytes: int) -> None:
        self._spill_bytes = spill_bytes
        self.chunks: list[bytes] = []
        self.path: str | None = None
        self._file: IO[bytes] | None = None
        self.size = 0
        self._digest = hashlib.sha256()

    def write(self, chunk: bytes) -> None:
        if not chunk:
            return
        self._digest.update(chunk)
        self.size += len(chunk)
        if self._file is None and self.size > self._spill_bytes:
            self._open_file()
            for held in self.chunks:
                self._write_file(held)
            self.chunks.clear()
        if self._file is not None:
            self._write_file(chunk)
        else:
            self.chunks.append(chunk)

    def _write_file(self, chunk: bytes) -> None:
        assert self._file is not None
        self._file.write(chunk)

    def _open_file(self) -> None:
        fd, self.path = tempfile.mkstemp(prefix="syvain-shard-", suffix=".part")
        self._file = os.fdopen(fd, "wb")

    def adopt_file(self) -> str:
        """A temporary file for a writer that fills it itself (parquet); hash it afterwards."""
        self._open_file()
        assert self._file is not None and self.path is not None
        self._file.close()
        self._file = None
        return self.path

    def hash_file(self) -> None:
        assert self.path is not None
        self.size = 0
        with open(self.path, "rb") as file:
            while chunk := file.read(_HASH_CHUNK):
                self._digest.update(chunk)
                self.size += len(chunk)

    def sha256(self) -> str:
        return self._digest.hexdigest()

    def seal(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def close(self) -> None:
        self.seal()
        self.chunks.clear()
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self.path = None


def _encode_native(
    data_format: str, records: Iterator[Mapping[str, Any]], spool: _Spool, check: Any
) -> int:
    encoder = _native.ShardEncoder(data_format)
    while batch := list(itertools.islice(records, _BATCH_RECORDS)):
        spool.write(encoder.encode(batch))
        check(spool.size)
    spool.write(encoder.finish())
    check(spool.size)
    return int(encoder.records)


def _encode_parquet(records: Iterator[Mapping[str, Any]], spool: _Spool) -> int:
    from syvain_training_data.formats.parquet import write_parquet_shard

    path = spool.adopt_file()
    written = write_parquet_shard(records, path)
    spool.hash_file()
    return written.records


# --------------------------------------------------------------------------------------------
# The saver
# --------------------------------------------------------------------------------------------


class DatasetSaver:
    """Writes the shards of one dataset and, last, its manifest (SPEC section 5).

    Build one with :meth:`SyvainTrainingData.dataset_saver`. It is picklable: copies in worker
    processes (ProcessPoolExecutor, Ray tasks, other machines) save shards, and the parent's
    :meth:`commit_manifest` publishes every deterministic shard any of them completed, plus the
    shards without ``shard_id`` saved by this saver or its copies.
    """

    def __init__(
        self,
        manifest_uri: str,
        *,
        data_format: DataManifestDataFormat = "jsonl.gz",
        storage_config: StorageConfig | None = None,
    ) -> None:
        if not isinstance(manifest_uri, str) or manifest_uri.endswith("/"):
            raise ValueError(f"manifest_uri must be an object key, not a prefix: {manifest_uri!r}")
        if data_format not in DATA_FORMATS:
            raise ValueError(
                f"Unknown data format {data_format!r}; expected one of {', '.join(DATA_FORMATS)}"
            )
        key = _manifest_key(manifest_uri)
        self.manifest_uri = manifest_uri
        self.data_format: DataManifestDataFormat = data_format
        self.storage_config = storage_config or StorageConfig()
        self.shard_base_uri = manifest_uri.rsplit("/", 1)[0] + "/shards"
        self.deterministic_base_uri = (
            f"{self.shard_base_uri}/by-manifest/{hashlib.sha256(key.encode('utf-8')).hexdigest()}"
        )
        self.session_id = uuid.uuid4().hex
        self._saved: dict[str, _Saved] = {}
        self._curricula: dict[tuple[str, str], tuple[tuple[str, ...], str | None]] = {}
        self._split_orders: dict[str, tuple[str, ...]] = {}
        self._expected: dict[tuple[str, str | None], frozenset[str]] = {}
        self._lock = threading.RLock()
        native_storage(self.storage_config)  # a bad endpoint fails now

    # -- pickling: everything but the lock ---------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"DatasetSaver({self.manifest_uri!r}, data_format={self.data_format!r})"

    # -- layout ------------------------------------------------------------------------------

    def shard_uri(self, split: str, curriculum_stage: str | None, shard_id: str | None) -> str:
        """The URI a shard gets (SPEC section 5); ``shard_id=None`` draws a random id."""
        split_segment = encode_segment(split, "split")
        if shard_id is None:
            base, part = self.shard_base_uri, uuid.uuid4().hex
        else:
            base, part = self.deterministic_base_uri, encode_segment(shard_id, "shard_id")
        prefix = f"{base}/{split_segment}"
        if curriculum_stage is not None:
            prefix += f"/curriculum/{encode_segment(curriculum_stage, 'curriculum_stage')}"
        return f"{prefix}/part-{part}{SUFFIXES[self.data_format]}"

    def _session_record_uri(self, shard_uri: str) -> str:
        name = shard_uri.rsplit("/", 1)[1]
        return (
            f"{self.deterministic_base_uri}/{SESSIONS_SEGMENT}/{self.session_id}/"
            f"{name}{SESSION_RECORD_SUFFIX}"
        )

    # -- saving ------------------------------------------------------------------------------

    def save(
        self,
        split: str,
        curriculum_stage: str | None,
        records: Iterable[Mapping[str, Any]],
        *,
        curriculum_metadata: Mapping[str, Any] | None = None,
        shard_id: str | None = None,
    ) -> ManifestShard:
        """Encodes ``records`` into one shard, uploads it, and registers it for the manifest.

        With ``shard_id`` the shard is deterministic: a completed one (found by :meth:`recover`)
        is returned without consuming ``records``; otherwise it is uploaded create-only and gets
        its completion descriptor.

        Raises:
            ValueError: empty split, stage or shard_id; metadata without a stage; metadata that
                is not a JSON object; ``"Cannot save an empty record shard"``; a deterministic
                parquet or msgpack.zstf shard of 5 GiB or more; a record the format cannot
                encode.
            PublicationConflictError: an existing data object or descriptor with other bytes,
                or the same URI registered with other content.
            FileNotFoundError, PermissionError, StorageRetryExhaustedError: from the store.
        """
        encode_segment(split, "split")
        if curriculum_stage is not None:
            encode_segment(curriculum_stage, "curriculum_stage")
        if curriculum_metadata is not None and curriculum_stage is None:
            raise ValueError("curriculum_metadata requires a curriculum_stage")
        metadata = _validate_metadata(curriculum_metadata)
        if shard_id is not None:
            found = self.recover(
                split, curriculum_stage, shard_id=shard_id, curriculum_metadata=curriculum_metadata
            )
            if found is not None:
                return found
        uri = self.shard_uri(split, curriculum_stage, shard_id)
        iterator = iter(records)
        first = next(iterator, _UNSET)
        if isinstance(first, _Unset):
            raise ValueError("Cannot save an empty record shard")
        spool = _Spool(_limits.spill_bytes)
        try:
            count = self._encode(itertools.chain((first,), iterator), spool, shard_id)
            shard = self._upload(uri, spool, count, deterministic=shard_id is not None)
            descriptor = descriptor_bytes(
                shard=shard,
                data_format=self.data_format,
                split=split,
                curriculum_stage=curriculum_stage,
                curriculum_metadata=None if metadata is None else json.loads(metadata),
                sha256=spool.sha256(),
            )
        finally:
            spool.close()
        if shard_id is not None:
            self._create_descriptor(uri + DESCRIPTOR_SUFFIX, descriptor)
        else:
            put_object(
                self._session_record_uri(uri),
                descriptor,
                storage_config=self.storage_config,
                content_type="application/json",
                create_only=True,
            )
        self._register(_Saved(split, curriculum_stage, metadata, shard, shard_id is not None))
        return shard

    def _encode(
        self, records: Iterator[Mapping[str, Any]], spool: _Spool, shard_id: str | None
    ) -> int:
        limit = _limits.deterministic_single_put_bytes
        single_put = shard_id is not None and self.data_format in _SINGLE_PUT_FORMATS

        def check(size: int) -> None:
            if single_put and size >= limit:
                raise ValueError(
                    f"Deterministic {self.data_format} shard {shard_id!r} reached {size} bytes: "
                    f"deterministic parquet and msgpack.zstf shards must be smaller than "
                    f"{_format_bytes(limit)} (one create-only PUT); spread the records over more "
                    "shard IDs"
                )

        if self.data_format == "parquet":
            count = _encode_parquet(records, spool)
            check(spool.size)
        else:
            count = _encode_native(self.data_format, records, spool, check)
        spool.seal()
        return count

    def _upload(
        self, uri: str, spool: _Spool, records: int, *, deterministic: bool
    ) -> ManifestShard:
        size, etag = _upload_spool(
            uri, spool, self.data_format, self.storage_config, create_only=deterministic
        )
        return ManifestShard(
            uri=uri, records=records, size_bytes=size, etag=portable_etag(uri, etag)
        )

    def _create_descriptor(self, uri: str, data: bytes) -> None:
        try:
            put_object(
                uri,
                data,
                storage_config=self.storage_config,
                content_type="application/json",
                create_only=True,
            )
        except FileExistsError:
            existing = get_object(uri, storage_config=self.storage_config)
            if existing != data:
                raise PublicationConflictError(
                    f"Completion descriptor {uri} already exists with different bytes"
                ) from None

    # -- recovery ----------------------------------------------------------------------------

    def recover(
        self,
        split: str,
        curriculum_stage: str | None,
        *,
        shard_id: str,
        curriculum_metadata: Mapping[str, Any] | None | _Unset = _UNSET,
    ) -> ManifestShard | None:
        """The completed deterministic shard ``shard_id``, registered for the manifest, or None
        when it has no completion descriptor.

        Raises:
            PublicationConflictError: the descriptor is not exactly what this saver would write
                (keys, schema, digest, format, split, stage, URI and, when passed, metadata), or
                its data object is missing or differs (size; etag where both are known, else
                sha256).
            ValueError: an empty split, stage or shard_id, or metadata that is not an object.
        """
        expected_metadata: str | None | _Unset = _UNSET
        if not isinstance(curriculum_metadata, _Unset):
            expected_metadata = _validate_metadata(curriculum_metadata)
        uri = self.shard_uri(split, curriculum_stage, shard_id)
        descriptor_uri = uri + DESCRIPTOR_SUFFIX
        try:
            data = get_object(descriptor_uri, storage_config=self.storage_config)
        except FileNotFoundError:
            return None
        saved = self._verify_descriptor(
            data,
            descriptor_uri,
            uri,
            split=split,
            stage=curriculum_stage,
            metadata=expected_metadata,
        )
        self._register(saved)
        return saved.shard

    def _verify_descriptor(
        self,
        data: bytes,
        descriptor_uri: str,
        shard_uri: str,
        *,
        split: str | None,
        stage: str | None | _Unset,
        metadata: str | None | _Unset,
        deterministic: bool = True,
    ) -> _Saved:
        """Checks a descriptor (``split=None``/``stage=_UNSET``: take them from it, then check the
        URI layout) and its data object; returns what it describes."""

        def conflict(reason: str) -> PublicationConflictError:
            return PublicationConflictError(f"Completion descriptor {descriptor_uri}: {reason}")

        document = _loads_descriptor(data, descriptor_uri)
        if not isinstance(document, dict) or set(document) != _DESCRIPTOR_KEYS:
            raise conflict(f"expected exactly the keys {sorted(_DESCRIPTOR_KEYS)}")
        if document["schema"] != DESCRIPTOR_SCHEMA:
            raise conflict(f"schema is {document['schema']!r}, expected {DESCRIPTOR_SCHEMA!r}")
        digest = document["sha256"]
        if not isinstance(digest, str) or len(digest) != 64 or not set(digest) <= _HEX:
            raise conflict("sha256 is not 64 lowercase hex digits")
        if document["data_format"] != self.data_format:
            raise conflict(f"data_format is {document['data_format']!r}, not {self.data_format!r}")
        found_split, found_stage = document["split"], document["curriculum_stage"]
        if not isinstance(found_split, str) or not (
            found_stage is None or isinstance(found_stage, str)
        ):
            raise conflict("split must be a string and curriculum_stage a string or null")
        if split is not None and found_split != split:
            raise conflict(f"split is {found_split!r}, not {split!r}")
        if not isinstance(stage, _Unset) and found_stage != stage:
            raise conflict(f"curriculum_stage is {found_stage!r}, not {stage!r}")
        try:
            found_metadata = _validate_metadata(document["curriculum_metadata"])
        except ValueError as error:
            raise conflict(str(error)) from None
        if found_metadata is not None and found_stage is None:
            raise conflict("curriculum_metadata without a curriculum_stage")
        if not isinstance(metadata, _Unset) and found_metadata != metadata:
            raise conflict("curriculum_metadata differs from the one passed")
        described = document["shard"]
        if not isinstance(described, dict) or set(described) != _SHARD_KEYS:
            raise conflict(f"shard must have exactly the keys {sorted(_SHARD_KEYS)}")
        try:
            shard = ManifestShard.model_validate(described, strict=True)
        except ValidationError as error:
            raise conflict(f"invalid shard: {error}") from None
        if shard.uri != shard_uri:
            raise conflict(f"shard uri is {shard.uri!r}, expected {shard_uri!r}")
        check_shard_scheme(self.manifest_uri, shard.uri)
        if split is None:
            self._check_layout(shard.uri, found_split, found_stage, deterministic, conflict)
        canonical = descriptor_bytes(
            shard=shard,
            data_format=self.data_format,
            split=found_split,
            curriculum_stage=found_stage,
            curriculum_metadata=None if found_metadata is None else json.loads(found_metadata),
            sha256=digest,
        )
        if canonical != data:
            raise conflict("its bytes are not the canonical descriptor bytes")
        self._verify_data_object(shard, digest, conflict)
        # A local etag an older saver wrote is neither enforced nor published (SPEC 4).
        shard = shard.model_copy(update={"etag": portable_etag(shard.uri, shard.etag)})
        return _Saved(found_split, found_stage, found_metadata, shard, deterministic)

    def _check_layout(
        self, uri: str, split: str, stage: str | None, deterministic: bool, conflict: Any
    ) -> None:
        base = self.deterministic_base_uri if deterministic else self.shard_base_uri
        try:
            prefix = f"{base}/{encode_segment(split, 'split')}/"
            if stage is not None:
                prefix += f"curriculum/{encode_segment(stage, 'curriculum_stage')}/"
        except ValueError as error:
            raise conflict(str(error)) from None
        name = uri[len(prefix) :] if uri.startswith(prefix) else ""
        suffix = SUFFIXES[self.data_format]
        part = (
            name[len("part-") : -len(suffix)]
            if name.startswith("part-") and name.endswith(suffix)
            else ""
        )
        if not part or "/" in part:
            raise conflict(
                f"shard uri {uri!r} is not where split {split!r} stage {stage!r} shards go"
            )

    def _verify_data_object(self, shard: ManifestShard, digest: str, conflict: Any) -> None:
        try:
            info = head_object(shard.uri, storage_config=self.storage_config)
        except FileNotFoundError:
            raise conflict(f"its data object {shard.uri} does not exist") from None
        if info.size != shard.size_bytes:
            raise conflict(f"its data object has {info.size} bytes, not {shard.size_bytes}")
        etag = portable_etag(shard.uri, shard.etag)
        if info.etag and etag:
            if info.etag != etag:
                raise conflict(f"its data object has etag {info.etag!r}, not {etag!r}")
        elif _stream_sha256(shard.uri, info.size, info.etag, self.storage_config) != digest:
            raise conflict("its data object's sha256 differs")

    # -- shards found in the store -----------------------------------------------------------

    def _scan_store(self) -> None:
        """Registers every completed deterministic shard under the manifest and every shard
        this saver's session saved without shard_id (all verified)."""
        objects = list_objects(self.deterministic_base_uri, storage_config=self.storage_config)
        session_prefix = f"{self.deterministic_base_uri}/{SESSIONS_SEGMENT}/{self.session_id}/"
        tasks: list[tuple[str, str, bool]] = []
        for info in objects:
            if info.uri.endswith(DESCRIPTOR_SUFFIX):
                tasks.append((info.uri, info.uri[: -len(DESCRIPTOR_SUFFIX)], True))
            elif info.uri.startswith(session_prefix) and info.uri.endswith(SESSION_RECORD_SUFFIX):
                tasks.append((info.uri, "", False))

        def verify(task: tuple[str, str, bool]) -> _Saved:
            uri, shard_uri, deterministic = task
            data = get_object(uri, storage_config=self.storage_config)
            if not deterministic:
                # The record is named after its shard; its URI is read from it, then checked.
                document = _loads_descriptor(data, uri)
                described = document.get("shard") if isinstance(document, dict) else None
                shard_uri = described.get("uri", "") if isinstance(described, dict) else ""
                if shard_uri.rsplit("/", 1)[-1] + SESSION_RECORD_SUFFIX != uri.rsplit("/", 1)[1]:
                    raise PublicationConflictError(f"Saved-shard record {uri} names another shard")
            return self._verify_descriptor(
                data,
                uri,
                str(shard_uri),
                split=None,
                stage=_UNSET,
                metadata=_UNSET,
                deterministic=deterministic,
            )

        with ThreadPoolExecutor(max_workers=_SCAN_THREADS) as pool:
            found = list(pool.map(verify, tasks))
        for saved in found:
            self._register(saved)

    def _register(self, saved: _Saved) -> None:
        with self._lock:
            existing = self._saved.get(saved.shard.uri)
            if existing is not None and existing != saved:
                raise PublicationConflictError(
                    f"Shard {saved.shard.uri} is registered twice with different content"
                )
            self._saved[saved.shard.uri] = saved

    def _known(self, split: str, uris: Sequence[str]) -> dict[str, _Saved]:
        """The saved shards of ``split``, from the store too when some URI is not known here."""
        with self._lock:
            missing = [uri for uri in uris if uri not in self._saved]
        if missing:
            self._scan_store()
        with self._lock:
            in_split = {uri: s for uri, s in self._saved.items() if s.split == split}
        unknown = [uri for uri in uris if uri not in in_split]
        if unknown:
            raise ValueError(
                f"Shards not saved or recovered in split {split!r}: {', '.join(unknown)}"
            )
        return in_split

    # -- ordering ----------------------------------------------------------------------------

    def register_curriculum(
        self,
        split: str,
        curriculum_stage: str,
        shards: Sequence[ManifestShard | str],
        *,
        curriculum_metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Names the ordered shards of a curriculum stage (shards or their URIs), all already
        saved or recovered in ``split``.

        Raises:
            ValueError: empty names or selection, a repeated shard, a shard not saved in the
                split, a selection that contradicts the stage inferred from saves, metadata that
                is not an object or that differs from the saves'.
            PublicationConflictError: a different registration of the same stage exists.
        """
        encode_segment(split, "split")
        encode_segment(curriculum_stage, "curriculum_stage")
        uris = _uris_of(shards, f"curriculum stage {curriculum_stage!r}")
        metadata = _validate_metadata(curriculum_metadata)
        in_split = self._known(split, uris)
        inferred = {uri for uri, s in in_split.items() if s.stage == curriculum_stage}
        if inferred and inferred != set(uris):
            raise ValueError(
                f"register_curriculum for stage {curriculum_stage!r} of split {split!r} "
                f"contradicts the shards saved with that stage ({len(inferred)} saved, "
                f"{len(uris)} registered)"
            )
        saved_values = {s.metadata for uri, s in in_split.items() if s.stage == curriculum_stage}
        if metadata is not None and saved_values - {None} and saved_values != {metadata}:
            raise ValueError(f"Inconsistent curriculum metadata for stage {curriculum_stage!r}")
        registration = (tuple(uris), metadata)
        with self._lock:
            existing = self._curricula.get((split, curriculum_stage))
            if existing is not None and existing != registration:
                raise PublicationConflictError(
                    f"Curriculum stage {curriculum_stage!r} of split {split!r} is already "
                    "registered with other shards or metadata"
                )
            self._curricula[(split, curriculum_stage)] = registration

    def register_split_order(self, split: str, shards: Sequence[ManifestShard | str]) -> None:
        """Orders the shards of ``split``: every saved shard of the split exactly once.

        Raises:
            ValueError: a repeated, unknown or missing shard.
            PublicationConflictError: a different order of the split is already registered.
        """
        encode_segment(split, "split")
        uris = _uris_of(shards, f"split {split!r}")
        in_split = self._known(split, uris)
        left_out = sorted(set(in_split) - set(uris))
        if left_out:
            raise ValueError(
                f"register_split_order for split {split!r} leaves out saved shards: "
                f"{', '.join(left_out)}"
            )
        with self._lock:
            existing = self._split_orders.get(split)
            if existing is not None and existing != tuple(uris):
                raise PublicationConflictError(f"Split {split!r} already has another shard order")
            self._split_orders[split] = tuple(uris)

    def expect_shards(
        self, split: str, curriculum_stage: str | None, shard_ids: Iterable[str]
    ) -> None:
        """States the complete set of deterministic shard IDs of ``split`` and stage: the commit
        refuses, naming them, when any is missing or another was saved there.

        Raises ValueError for empty names or IDs, PublicationConflictError when another set was
        stated for the same split and stage."""
        encode_segment(split, "split")
        if curriculum_stage is not None:
            encode_segment(curriculum_stage, "curriculum_stage")
        ids = frozenset(shard_ids)
        for shard_id in ids:
            encode_segment(shard_id, "shard_id")
        key = (split, curriculum_stage)
        with self._lock:
            existing = self._expected.get(key)
            if existing is not None and existing != ids:
                raise PublicationConflictError(
                    f"Other shard IDs are already expected for split {split!r} stage "
                    f"{curriculum_stage!r}"
                )
            self._expected[key] = ids

    # -- the manifest ------------------------------------------------------------------------

    def build_manifest(self) -> DataManifest:
        """The manifest of every registered shard and every completed one found in the store.

        Raises:
            ValueError: no saved shards (``"Cannot commit a manifest with no saved shards"``);
                ``"Partial curriculum metadata for stage 'x'"``; ``"Inconsistent curriculum
                metadata for stage 'x'"``; expected shards missing; an order that no longer
                names every shard.
            PublicationConflictError: a tampered descriptor or data object; a URI registered
                twice with different content.
        """
        self._scan_store()
        with self._lock:
            saved = dict(self._saved)
            curricula = dict(self._curricula)
            orders = dict(self._split_orders)
            expected = dict(self._expected)
        if not saved:
            raise ValueError("Cannot commit a manifest with no saved shards")
        self._check_expected(saved, expected)
        splits: dict[str, Any] = {}
        for split in sorted({s.split for s in saved.values()}):
            in_split = {uri: s for uri, s in saved.items() if s.split == split}
            order = orders.get(split)
            if order is None:
                order = tuple(sorted(in_split))
            elif set(order) != set(in_split):
                raise ValueError(
                    f"The registered order of split {split!r} does not name every saved shard: "
                    f"{', '.join(sorted(set(in_split) - set(order)))}"
                )
            stages = {s.stage for s in in_split.values() if s.stage is not None}
            stages |= {stage for (name, stage) in curricula if name == split}
            curriculum: dict[str, Any] = {}
            for stage in sorted(stages):
                members = {uri: s for uri, s in in_split.items() if s.stage == stage}
                values = [s.metadata for s in members.values()]
                registered = curricula.get((split, stage))
                if registered is None:
                    stage_uris: tuple[str, ...] = tuple(sorted(members))
                    metadata = _stage_metadata(stage, values)
                else:
                    stage_uris, registered_metadata = registered
                    if members and set(members) != set(stage_uris):
                        raise ValueError(
                            f"The registered curriculum stage {stage!r} of split {split!r} "
                            "contradicts the shards saved with that stage"
                        )
                    missing = [uri for uri in stage_uris if uri not in in_split]
                    if missing:
                        raise ValueError(
                            f"Shards not saved in split {split!r}: {', '.join(missing)}"
                        )
                    metadata = _stage_metadata(stage, values) if members else {}
                    if registered_metadata is not None:
                        if any(v is not None for v in values) and metadata != json.loads(
                            registered_metadata
                        ):
                            raise ValueError(
                                f"Inconsistent curriculum metadata for stage {stage!r}"
                            )
                        metadata = json.loads(registered_metadata)
                stage_shards = [in_split[uri].shard for uri in stage_uris]
                curriculum[stage] = {
                    "records": sum(shard.records for shard in stage_shards),
                    "shards": stage_shards,
                    "metadata": metadata,
                }
            split_shards = [in_split[uri].shard for uri in order]
            splits[split] = {
                "records": sum(shard.records for shard in split_shards),
                "shards": split_shards,
                "curriculum": curriculum,
            }
        return DataManifest.model_validate(
            {"version": 1, "data_format": self.data_format, "splits": splits}
        )

    def _check_expected(
        self, saved: dict[str, _Saved], expected: dict[tuple[str, str | None], frozenset[str]]
    ) -> None:
        problems = []
        for (split, stage), ids in sorted(expected.items(), key=lambda item: repr(item[0])):
            wanted = {self.shard_uri(split, stage, shard_id): shard_id for shard_id in ids}
            found = {
                uri
                for uri, s in saved.items()
                if s.deterministic and s.split == split and s.stage == stage
            }
            missing = sorted(wanted[uri] for uri in set(wanted) - found)
            extra = sorted(found - set(wanted))
            if missing:
                problems.append(f"split {split!r} stage {stage!r} is missing shard IDs {missing}")
            if extra:
                problems.append(f"split {split!r} stage {stage!r} has unexpected shards {extra}")
        if problems:
            raise ValueError("Cannot commit the manifest: " + "; ".join(problems))

    def commit_manifest(self) -> DataManifest:
        """Writes the manifest create-only, last: the publication marker.

        An existing manifest equal to what would be written is returned (idempotent).

        Raises:
            PublicationConflictError: a different or invalid manifest already exists (and the
                conflicts of :meth:`build_manifest`).
            ValueError: see :meth:`build_manifest`.
        """
        manifest = self.build_manifest()
        data = canonical_manifest_bytes(manifest)
        try:
            put_object(
                self.manifest_uri,
                data,
                storage_config=self.storage_config,
                content_type="application/json",
                create_only=True,
            )
            return manifest
        except FileExistsError:
            existing = get_object(self.manifest_uri, storage_config=self.storage_config)
        if existing == data:
            return manifest
        try:
            published = parse_manifest(existing, self.manifest_uri)
        except ValueError as error:
            raise PublicationConflictError(
                f"An invalid manifest already exists at {self.manifest_uri}"
            ) from error
        if published != manifest:
            raise PublicationConflictError(
                f"A different manifest is already published at {self.manifest_uri}"
            )
        return published


def _uris_of(shards: Sequence[ManifestShard | str], what: str) -> list[str]:
    if isinstance(shards, str | ManifestShard):
        raise TypeError(f"shards of {what} must be a sequence of shards or URIs")
    uris = [shard.uri if isinstance(shard, ManifestShard) else shard for shard in shards]
    if not uris:
        raise ValueError(f"{what} needs at least one shard")
    repeated = sorted(uri for uri, count in Counter(uris).items() if count > 1)
    if repeated:
        raise ValueError(f"{what} repeats shards: {', '.join(repeated)}")
    return uris


def _stage_metadata(stage: str, values: list[str | None]) -> dict[str, Any]:
    present = [value for value in values if value is not None]
    if not present:
        return {}
    if len(present) != len(values):
        raise ValueError(f"Partial curriculum metadata for stage {stage!r}")
    if len(set(present)) > 1:
        raise ValueError(f"Inconsistent curriculum metadata for stage {stage!r}")
    return cast(dict[str, Any], json.loads(present[0]))


def _upload_spool(
    uri: str,
    spool: _Spool,
    data_format: str,
    storage_config: StorageConfig,
    *,
    create_only: bool,
) -> tuple[int, str]:
    """Uploads sealed spooled bytes with the format's object attributes; returns (size, etag).

    In memory: one PUT from the chunks; in a file: the native ``put_file`` (one PUT, or a
    streamed multipart upload). A create-only upload that finds an object holding exactly these
    bytes reuses it; other bytes are a PublicationConflictError.
    """
    content_type, attributes = OBJECT_ATTRIBUTES[data_format]
    client = native_storage(storage_config)
    try:
        if spool.path is not None:
            return _native.put_file(
                client,
                uri,
                spool.path,
                content_type=content_type,
                metadata=attributes,
                create_only=create_only,
                single_put_max=_limits.deterministic_single_put_bytes,
                multipart_threshold=_limits.multipart_threshold,
                part_size=_limits.part_size,
            )
        return _native.put_chunks(
            client,
            uri,
            spool.chunks,
            content_type=content_type,
            metadata=attributes,
            create_only=create_only,
        )
    except FileExistsError:
        etag = _check_existing_bytes(uri, spool.size, spool.sha256(), storage_config)
        logger.info("Reusing the identical existing object %s", uri)
        return spool.size, etag


def _check_existing_bytes(uri: str, size: int, sha256: str, storage_config: StorageConfig) -> str:
    """The etag of an existing object that holds exactly our bytes; else a conflict."""
    info = head_object(uri, storage_config=storage_config)
    if info.size != size or _stream_sha256(uri, info.size, info.etag, storage_config) != sha256:
        raise PublicationConflictError(
            f"Shard {uri} already exists with different bytes ({info.size} bytes; this write "
            f"has {size}): another job wrote it"
        )
    return info.etag


def copy_shard(
    shard: ManifestShard,
    destination_uri: str,
    *,
    data_format: DataManifestDataFormat,
    storage_config: StorageConfig | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> ManifestShard:
    """Copies one shard's bytes to ``destination_uri`` and returns it described there (the
    source's ``records``, the destination's size and etag).

    The source is streamed (size and etag checked, resumed after transient failures) into the
    saver's spool: memory up to 64 MiB, then a temporary file, so memory stays bounded whatever
    the shard's size. The destination is written create-only with the format's object
    attributes; an existing object with identical bytes is reused (a re-run copy is
    idempotent). ``on_bytes`` is called with the size of every chunk received.

    Raises:
        PublicationConflictError: the destination holds other bytes.
        RuntimeError: the source's size disagrees with ``shard.size_bytes``.
        FileNotFoundError, PermissionError, ObjectChangedError, StorageRetryExhaustedError:
            from the store.
    """
    config = storage_config or StorageConfig()
    spool = _Spool(_limits.spill_bytes)
    try:
        source_etag = portable_etag(shard.uri, shard.etag) or None
        with open_stream(
            shard.uri, size_bytes=shard.size_bytes, etag=source_etag, storage_config=config
        ) as stream:
            for chunk in stream:
                spool.write(chunk)
                if on_bytes is not None:
                    on_bytes(len(chunk))
        spool.seal()
        size, etag = _upload_spool(destination_uri, spool, data_format, config, create_only=True)
    finally:
        spool.close()
    return ManifestShard(
        uri=destination_uri,
        records=shard.records,
        size_bytes=size,
        etag=portable_etag(destination_uri, etag),
    )


def _stream_sha256(uri: str, size: int, etag: str, storage_config: StorageConfig) -> str:
    digest = hashlib.sha256()
    with open_stream(
        uri, size_bytes=size, etag=etag or None, storage_config=storage_config
    ) as stream:
        for chunk in stream:
            digest.update(chunk)
    return digest.hexdigest()


def _format_bytes(size: int) -> str:
    if size % (1024**3) == 0:
        return f"{size // 1024**3} GiB"
    return f"{size} bytes"
