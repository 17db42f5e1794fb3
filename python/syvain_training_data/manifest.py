"""Data manifest v1: the pydantic contract of SPEC section 2.

A data manifest is a JSON object naming every shard of a published dataset::

    {
      "version": 1,
      "data_format": "jsonl.gz",
      "splits": {
        "train": {
          "records": 3,
          "shards": [{"uri": "s3://b/k", "records": 3, "size_bytes": 10, "etag": ""}],
          "curriculum": {}
        }
      }
    }

All models are strict (no coercion: ``"1"``, ``1.0`` and ``True`` are not integers), frozen
(attribute assignment raises) and forbid unknown fields.  Fields keep the order SPEC lists,
which is also their order in the canonical bytes (:func:`canonical_manifest_bytes`).

Rules, each enforced at validation time:

- ``version`` is the integer 1; ``data_format`` is one of :data:`DATA_FORMATS`.
- ``splits`` holds at least one split; split and curriculum stage names are non-empty.
- Every ``records`` and ``size_bytes`` is an integer > 0; every ``shards`` list holds at least
  one shard; a split's and a stage's ``records`` equal the sum of their shards' records.
- A shard URI is ``s3://bucket/key`` or ``file:///absolute/path`` (the local directory store of
  SPEC section 4), under the rules of :mod:`syvain_training_data.uris`, the store's own: a
  manifest that validates names only objects the store can read.

Decisions taken where SPEC is silent:

- **Stages are subsets of their split.** SPEC says a split's ``shards`` list holds every shard
  of the split, those of its stages included.  So every shard a curriculum stage lists must
  also be in its split's ``shards`` list, with the same ``records``, ``size_bytes`` and ``etag``
  (a URI names one immutable object, so two descriptions of it must agree).  Stages may overlap.
  The check compares whole shards, so a stage shard that differs only in its etag is rejected.
- **No repeated shard URIs within one shards list.** A URI names one object; the saver never
  writes a repeat and the loader de-duplicates URIs, so a repeat is rejected rather than read
  twice.  The same URI may appear in several stages, and in several splits.
- **Metadata is finite, encodable JSON** and every string is encodable as UTF-8
  (:mod:`syvain_training_data.strict_json` says why).
- **Counts and sizes are below 2**63** (:data:`MAX_COUNT` is ``2**63 - 1``): every shard's
  ``records`` and ``size_bytes`` and every split's and stage's ``records``, and so the sum of a
  split's (or a stage's) shard records, which must equal its ``records``; the sum of a split's
  shard ``size_bytes`` is capped the same way.  No real dataset comes near (2**63 bytes is
  8 EiB), every other implementation's signed 64-bit counters hold them, and the loader's
  planning stays bounded: a count of thousands of digits is rejected at parse time instead of
  making a reader plan or mix with it.
- **A manifest is at most 256 MiB** (:data:`MAX_MANIFEST_BYTES`).  :func:`read_manifest_bytes`
  (what ``load_manifest``, the loader, the Ray datasource, the saver and the command line
  use) checks the object's size with a HEAD before it reads a byte, then reads it once into one
  buffer; :func:`parse_manifest` refuses longer bytes too.  A shard entry takes about 270
  bytes of canonical JSON (a split's listing and each stage's count separately), so the limit
  holds about a million of them.
- **Other integers (metadata) have at most 4300 digits** (:mod:`.strict_json`).
- **Nesting is bounded.** A stage's ``metadata`` may nest at most
  :data:`MAX_METADATA_DEPTH` (123) objects and arrays deep, the metadata object itself
  included, so a whole manifest nests at most 128 deep: the default limit of common strict
  parsers (serde_json), and well inside what pydantic can serialize (about 250).
- **JSON text is parsed strictly** (:func:`~syvain_training_data.strict_json.loads_strict_json`):
  ``NaN`` / ``Infinity`` tokens, numbers that overflow a float, duplicate keys, a UTF-8 byte
  order mark and nesting too deep for the parser are "not valid JSON".  JSON floats (``1.5``,
  ``1e3``) are of course accepted in metadata; they are not accepted where an integer is
  required.
- Split and stage names are only required to be non-empty: whitespace is kept as written.
- Frozen means attribute assignment raises; the ``dict`` and ``list`` values inside a model
  are ordinary containers and must not be mutated.  :func:`validate_manifest` re-validates an
  existing model from scratch.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from syvain_training_data.storage import StorageConfig, head_object, open_stream
from syvain_training_data.strict_json import (
    JsonObject,
    JsonValue,
    Utf8Str,
    json_depth,
    loads_strict_json,
)
from syvain_training_data.uris import FILE_PREFIX, check_uri, file_path

__all__ = [
    "DATA_FORMATS",
    "MAX_COUNT",
    "MAX_MANIFEST_BYTES",
    "MAX_METADATA_DEPTH",
    "DataManifest",
    "DataManifestDataFormat",
    "JsonObject",
    "JsonValue",
    "ManifestCurriculumStage",
    "ManifestDatasetEntry",
    "ManifestShard",
    "canonical_manifest_bytes",
    "parse_manifest",
    "read_manifest_bytes",
    "validate_manifest",
]

DataManifestDataFormat = Literal["jsonl.gz", "parquet", "msgpack.zstf"]
"""The shard formats of SPEC section 3 (a plain alias, so ``typing.get_args`` works on it)."""

DATA_FORMATS: tuple[DataManifestDataFormat, ...] = get_args(DataManifestDataFormat)
"""Every :data:`DataManifestDataFormat`, in SPEC order."""


# --------------------------------------------------------------------------------------------
# Scalar building blocks
# --------------------------------------------------------------------------------------------


MAX_COUNT = 2**63 - 1
"""The largest ``records`` or ``size_bytes`` a manifest may hold (also the largest sum of a
split's shard sizes): counts and sizes are below 2**63."""

_Count = Annotated[int, Field(strict=True, gt=0, le=MAX_COUNT)]


def _check_shard_uri(uri: str) -> str:
    """Accept ``s3://bucket/key``, ``file:///absolute/path``, ``https://host/path`` (or
    ``http://``, read only with ``allow_http``) or ``hf://datasets/owner/name@revision/path``
    under the store's rules (:func:`~syvain_training_data.uris.check_uri`)."""
    try:
        return check_uri(uri)
    except ValueError as error:
        raise ValueError(
            "shard URI must be s3://bucket/key (bucket and key non-empty, the bucket name "
            f"without / ? # @ : %, whitespace or control characters), gs://bucket/key, "
            "file:///absolute/path, https://host/path (http:// with allow_http) or "
            f"hf://datasets/owner/name@revision/path: {error}"
        ) from None


_ShardUri = Annotated[Utf8Str, AfterValidator(_check_shard_uri)]


MAX_METADATA_DEPTH = 123
"""How many objects and arrays deep a stage's metadata may nest, the metadata object included."""


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


class _ManifestModel(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")


def _check_shard_list(shards: list[ManifestShard]) -> list[ManifestShard]:
    if not shards:
        raise ValueError("at least one shard is required")
    seen: set[str] = set()
    for shard in shards:
        if shard.uri in seen:
            raise ValueError(f"shard URI {shard.uri!r} is listed more than once")
        seen.add(shard.uri)
    return shards


def _check_records_sum(records: int, shards: list[ManifestShard]) -> None:
    total = sum(shard.records for shard in shards)
    if records != total:
        raise ValueError(f"records is {records} but its shards hold {total} records in total")


class ManifestShard(_ManifestModel):
    """One immutable shard object.

    Fields: ``uri`` (``s3://bucket/key`` or ``file:///absolute/path``), ``records`` and
    ``size_bytes`` (ints, 0 < n < 2**63), ``etag`` (str, default ``""``: unknown).

    Raises:
        pydantic.ValidationError: (a ValueError) on any violated rule.
    """

    uri: _ShardUri
    records: _Count
    size_bytes: _Count
    etag: Utf8Str = ""


class ManifestCurriculumStage(_ManifestModel):
    """A named, ordered subset of a split's shards.

    Fields: ``records`` (int, 0 < n < 2**63, the sum of the shards' records), ``shards`` (at
    least one, no repeated URI), ``metadata`` (:data:`JsonObject`, default ``{}``).

    Raises:
        pydantic.ValidationError: (a ValueError) on any violated rule.
    """

    records: _Count
    shards: list[ManifestShard]
    metadata: JsonObject = Field(default_factory=dict)

    _check_shards = field_validator("shards")(_check_shard_list)

    @field_validator("metadata")
    @classmethod
    def _check_metadata_depth(cls, metadata: dict[str, Any]) -> dict[str, Any]:
        depth = json_depth(metadata)
        if depth > MAX_METADATA_DEPTH:
            raise ValueError(
                f"metadata nests {depth} objects and arrays deep; at most "
                f"{MAX_METADATA_DEPTH} are allowed"
            )
        return metadata

    @model_validator(mode="after")
    def _check_sum(self) -> Self:
        _check_records_sum(self.records, self.shards)
        return self


class ManifestDatasetEntry(_ManifestModel):
    """One split: every shard of the split, and its curriculum stages.

    Fields: ``records`` (int, 0 < n < 2**63, the sum of the shards' records), ``shards`` (at
    least one, no repeated URI, including every shard of every stage, their sizes summing below
    2**63), ``curriculum`` (stage name ->
    :class:`ManifestCurriculumStage`, default ``{}``, names non-empty).

    Raises:
        pydantic.ValidationError: (a ValueError) on any violated rule, including a stage shard
            missing from ``shards`` or described differently there.
    """

    records: _Count
    shards: list[ManifestShard]
    curriculum: dict[Utf8Str, ManifestCurriculumStage] = Field(default_factory=dict)

    _check_shards = field_validator("shards")(_check_shard_list)

    @field_validator("curriculum")
    @classmethod
    def _check_stage_names(
        cls, curriculum: dict[str, ManifestCurriculumStage]
    ) -> dict[str, ManifestCurriculumStage]:
        if "" in curriculum:
            raise ValueError("curriculum stage names must be non-empty")
        return curriculum

    @model_validator(mode="after")
    def _check_entry(self) -> Self:
        _check_records_sum(self.records, self.shards)
        size = sum(shard.size_bytes for shard in self.shards)
        if size > MAX_COUNT:
            raise ValueError(
                f"the split's shards hold {size} bytes in total; at most 2**63 - 1 are allowed"
            )
        by_uri = {shard.uri: shard for shard in self.shards}
        for stage_name, stage in self.curriculum.items():
            for shard in stage.shards:
                listed = by_uri.get(shard.uri)
                if listed is None:
                    raise ValueError(
                        f"curriculum stage {stage_name!r} lists shard {shard.uri!r}, which is "
                        "not in the split's shards (a split's shards list holds every shard "
                        "of the split, those of its stages included)"
                    )
                if listed != shard:
                    raise ValueError(
                        f"curriculum stage {stage_name!r} describes shard {shard.uri!r} "
                        "differently from the split's shards list (records, size_bytes or "
                        "etag differ)"
                    )
        return self


class DataManifest(_ManifestModel):
    """A version 1 data manifest (SPEC section 2).

    Fields: ``version`` (the int 1), ``data_format`` (:data:`DataManifestDataFormat`),
    ``splits`` (split name -> :class:`ManifestDatasetEntry`, at least one, names non-empty).

    Build one from JSON bytes with :func:`parse_manifest`, from a mapping with
    :func:`validate_manifest`; serialize it with :func:`canonical_manifest_bytes`.

    Raises:
        pydantic.ValidationError: (a ValueError) on any violated rule.
    """

    version: Literal[1]
    data_format: DataManifestDataFormat
    splits: dict[Utf8Str, ManifestDatasetEntry]

    @field_validator("version", mode="before")
    @classmethod
    def _check_version_type(cls, version: object) -> object:
        # Literal[1] alone would accept True and 1.0, which compare equal to 1.
        if type(version) is not int:
            raise ValueError(f"version must be the integer 1, got {version!r}")
        return version

    @field_validator("splits")
    @classmethod
    def _check_splits(
        cls, splits: dict[str, ManifestDatasetEntry]
    ) -> dict[str, ManifestDatasetEntry]:
        if not splits:
            raise ValueError("at least one split is required")
        if "" in splits:
            raise ValueError("split names must be non-empty")
        return splits


# --------------------------------------------------------------------------------------------
# Parsing and serialization
# --------------------------------------------------------------------------------------------


MAX_MANIFEST_BYTES = 256 * 1024 * 1024
"""The largest data manifest read or parsed, in bytes (256 MiB)."""


def _too_large(uri: str, size: int) -> ValueError:
    return ValueError(
        f"Data manifest is too large: {uri} holds {size} bytes; the limit is "
        f"{MAX_MANIFEST_BYTES} bytes ({MAX_MANIFEST_BYTES / 2**20:g} MiB)"
    )


def _refuse_special_file(path: str) -> None:
    """OSError unless ``path`` is a regular file (or missing: the store then says so).  A HEAD
    of a FIFO would block; a device has no size."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(
            errno.EISDIR, f"Cannot read {path}: not a regular file (a directory)", path
        )
    kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
    raise OSError(errno.EINVAL, f"Cannot read {path}: not a regular file ({kind})", path)


def read_manifest_bytes(uri: str, *, storage_config: StorageConfig | None = None) -> bytearray:
    """The bytes of the manifest object at ``uri``, refused before any byte is read when the
    object is larger than :data:`MAX_MANIFEST_BYTES`.

    One HEAD gives the size (and the etag), then one ranged GET with If-Match on that etag
    streams the object into a single preallocated buffer (no second copy): a manifest replaced
    between the two requests is an error, never a mix of two objects.  On the local store the
    HEAD is a ``stat``.

    Raises:
        ValueError: the object is larger than the limit ("Data manifest is too large: {uri}
            holds N bytes; the limit is 268435456 bytes (256 MiB)"), or a bad URI.
        FileNotFoundError, PermissionError, ObjectChangedError, StorageRetryExhaustedError,
        RuntimeError (the size changed between HEAD and GET): from the store.
    """
    if uri.startswith(FILE_PREFIX):
        _refuse_special_file(file_path(uri))
    info = head_object(uri, storage_config=storage_config)
    if info.size > MAX_MANIFEST_BYTES:
        raise _too_large(uri, info.size)
    buffer = bytearray(info.size)
    if not info.size:
        return buffer
    view = memoryview(buffer)
    position = 0
    with open_stream(
        uri,
        size_bytes=info.size,
        # Held to the etag of the HEAD (never a file's: a local read is not pinned).
        etag=(None if uri.startswith(FILE_PREFIX) else info.etag or None),
        storage_config=storage_config,
    ) as stream:
        for chunk in stream:
            view[position : position + len(chunk)] = chunk
            position += len(chunk)
    view.release()
    return buffer


_SUMMARY_MAX_ERRORS = 20
_SUMMARY_MAX_LOCATION = 200


def _validation_summary(error: ValidationError) -> str:
    """One ``"  location: reason"`` line per error, bounded in count and width."""
    details = error.errors(include_url=False)
    lines = []
    for detail in details[:_SUMMARY_MAX_ERRORS]:
        location = ".".join(str(part) for part in detail["loc"]) or "<manifest>"
        if len(location) > _SUMMARY_MAX_LOCATION:
            half = _SUMMARY_MAX_LOCATION // 2
            location = f"{location[:half]}...{location[-half:]}"
        lines.append(f"  {location}: {detail['msg']}")
    if len(details) > _SUMMARY_MAX_ERRORS:
        lines.append(f"  ... and {len(details) - _SUMMARY_MAX_ERRORS} more errors")
    return "\n".join(lines)


def parse_manifest(data: bytes | bytearray | memoryview, uri: str) -> DataManifest:
    """Parse and validate the bytes of a data manifest read from ``uri``.

    ``uri`` is used only in error messages.  The bytes need not be canonical.  They are decoded
    once, without an intermediate copy.

    Raises:
        TypeError: ``data`` is not bytes-like.
        ValueError: ``"Data manifest is too large: {uri} ..."`` for more than
            :data:`MAX_MANIFEST_BYTES` bytes; otherwise with a message starting with exactly one of
            ``"Data manifest is not valid UTF-8: {uri}"``,
            ``"Data manifest is not valid JSON: {uri}"`` or
            ``"Data manifest has invalid shape: {uri}"``; the underlying
            :class:`UnicodeDecodeError`, JSON error or :class:`pydantic.ValidationError` is
            chained as ``__cause__``.  The invalid-shape message continues, on following lines,
            with one ``"  location: reason"`` line per failed rule.  (The error is a plain
            ValueError, not a ValidationError.)
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"data manifest bytes must be bytes, got {type(data).__name__}")
    size = memoryview(data).nbytes
    if size > MAX_MANIFEST_BYTES:
        raise _too_large(uri, size)
    try:
        text = str(data, "utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"Data manifest is not valid UTF-8: {uri}") from error
    try:
        value = loads_strict_json(text)
    except ValueError as error:  # json.JSONDecodeError, strict JSON rules, int digit limit
        raise ValueError(f"Data manifest is not valid JSON: {uri}") from error
    try:
        return DataManifest.model_validate(value, strict=True)
    except ValidationError as error:
        raise ValueError(
            f"Data manifest has invalid shape: {uri}\n{_validation_summary(error)}"
        ) from error


def validate_manifest(manifest: DataManifest | Mapping[str, object]) -> DataManifest:
    """Validate a manifest given as a mapping (or re-validate a model) under the strict rules.

    A mapping is validated exactly as :func:`parse_manifest` validates parsed JSON: nested
    objects must be ``dict`` and arrays ``list`` (the top level may be any Mapping), and no
    value is coerced.  A :class:`DataManifest` is re-validated from a dump of its fields, which
    catches a model whose inner dicts or lists were mutated, or one built with
    ``model_construct``; an equal, fresh model is returned.

    Raises:
        TypeError: ``manifest`` is neither a DataManifest nor a Mapping.
        pydantic.ValidationError: (a ValueError) the manifest breaks a rule of SPEC section 2.
    """
    if isinstance(manifest, DataManifest):
        data: dict[str, object] = manifest.model_dump()
    elif isinstance(manifest, Mapping):
        data = dict(manifest)
    else:
        raise TypeError(
            f"a data manifest must be a DataManifest or a Mapping, got {type(manifest).__name__}"
        )
    return DataManifest.model_validate(data, strict=True)


def canonical_manifest_bytes(manifest: DataManifest) -> bytes:
    """Return the canonical bytes of ``manifest`` (SPEC section 2).

    The bytes are ``manifest.model_dump_json(indent=2, exclude_none=True) + "\\n"`` encoded as
    UTF-8: fields in SPEC order, ``curriculum``, ``metadata`` and ``etag`` always present,
    non-ASCII characters written as-is.  ``parse_manifest(canonical_manifest_bytes(m), uri)``
    equals ``m`` for every valid manifest.  The model is not re-validated here; pass it
    through :func:`validate_manifest` first if its inner containers may have been mutated.

    Raises:
        TypeError: ``manifest`` is not a DataManifest.
        pydantic_core.PydanticSerializationError: the model holds a value that cannot be
            serialized (only possible after mutating its inner containers).
    """
    if not isinstance(manifest, DataManifest):
        raise TypeError(f"expected a DataManifest, got {type(manifest).__name__}")
    return (manifest.model_dump_json(indent=2, exclude_none=True) + "\n").encode("utf-8")
