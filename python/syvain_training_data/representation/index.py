"""The data manifest and the three index shards it pins (SPEC section 7).

The manifest is pinned by the caller's SHA-256; it must name exactly one index shard per
split, at its canonical URI, with an etag. Each shard is read after a HEAD that checks its
size and etag against the manifest, and each of its rows is checked into a paired or a
singleton claim. Every rule failure raises :class:`RepresentationIntegrityError` naming the
object, and the row where there is one.

Decisions where the SPEC is silent:

- An ``entry_kind`` other than ``paired_artifact`` or ``singleton_artifact`` is an error.
- Artifact URIs must be ``s3://bucket/key``; they need not be under the publication prefix
  (custody comes from the claimed digests, not from the location).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NoReturn

from syvain_training_data.errors import RepresentationIntegrityError
from syvain_training_data.manifest import (
    DataManifest,
    ManifestShard,
    canonical_manifest_bytes,
    parse_manifest,
)
from syvain_training_data.object_check import check_head, is_sha256_hex
from syvain_training_data.representation.custody import Claim, custody_errors, integrity_error
from syvain_training_data.representation.layout import (
    ARTIFACT_MANIFEST_NAME,
    PAIR_ROLES,
    SOURCES,
    SPLITS,
    is_count,
)
from syvain_training_data.shard import iter_shard
from syvain_training_data.storage import StorageConfig
from syvain_training_data.uris import check_shard_scheme, plain_etag, s3_bucket_key

__all__ = [
    "INDEX_COLUMNS",
    "IndexPair",
    "IndexSingleton",
    "check_index",
    "check_manifest",
    "read_index",
]

SINGLETON_SOURCE: Final = "__publication__"
SINGLETON_SPLIT: Final = "analysis"

PAIR_FIELDS: Final = (
    "safetensors_uri",
    "safetensors_size_bytes",
    "safetensors_sha256",
    "metadata_uri",
    "metadata_size_bytes",
    "metadata_sha256",
    "tensor_offset",
    "tensor_records",
    "tensor_total_records",
    "metadata_offset",
    "metadata_records",
    "metadata_total_records",
)
SINGLETON_FIELDS: Final = ("singleton_uri", "singleton_size_bytes", "singleton_sha256")
INDEX_COLUMNS: Final = ("entry_kind", "role", "source", "split", *PAIR_FIELDS, *SINGLETON_FIELDS)


def check_manifest(data: bytes, uri: str, prefix: str) -> dict[str, ManifestShard]:
    """The index shard of each split, after the manifest rules of SPEC section 7."""
    try:
        manifest = parse_manifest(data, uri)
    except ValueError as error:
        raise RepresentationIntegrityError(
            f"{uri}: the data manifest is not a valid manifest: {error}"
        ) from error
    if canonical_manifest_bytes(manifest) != data:
        integrity_error(uri, "the data manifest's bytes are not its canonical form (SPEC 2)")
    return _index_shards(manifest, uri, prefix)


def _index_shards(manifest: DataManifest, uri: str, prefix: str) -> dict[str, ManifestShard]:
    if manifest.data_format != "parquet":
        integrity_error(uri, f"data_format is {manifest.data_format!r}, not 'parquet'")
    if set(manifest.splits) != set(SPLITS):
        integrity_error(
            uri,
            f"splits are {', '.join(sorted(manifest.splits))}; expected exactly "
            f"{', '.join(SPLITS)}",
        )
    shards = {}
    for split in SPLITS:
        entry = manifest.splits[split]
        if entry.curriculum:
            integrity_error(uri, f"split {split!r} has a curriculum; it must have none")
        expected = f"{prefix}final/index/{split}.parquet"
        if len(entry.shards) != 1 or entry.shards[0].uri != expected:
            listed = ", ".join(shard.uri for shard in entry.shards)
            integrity_error(uri, f"split {split!r} must have the one shard {expected}: {listed}")
        shard = entry.shards[0]
        check_shard_scheme(uri, shard.uri)
        if shard.records != entry.records:
            integrity_error(uri, f"split {split!r} has {entry.records} records, its shard not")
        if not plain_etag(shard.etag):
            integrity_error(uri, f"the index shard {shard.uri} has no etag")
        shards[split] = shard
    return shards


def read_index(
    split: str, shard: ManifestShard, storage_config: StorageConfig
) -> list[dict[str, Any]]:
    """The rows of one index shard, read with the HEAD, size, etag and row-count checks."""
    with custody_errors(shard.uri):
        check = check_head(shard.uri, storage_config, size=shard.size_bytes, etag=shard.etag)
        info, mismatch = check.info, check.mismatch
        if mismatch is not None and mismatch.field == "size":
            integrity_error(
                shard.uri,
                f"the index shard has {info.size} bytes but the manifest says {shard.size_bytes}",
            )
        if mismatch is not None:
            integrity_error(
                shard.uri,
                f"the index shard has etag {info.etag} but the manifest says {shard.etag}",
            )
        return [dict(row) for row in iter_shard("parquet", shard, storage_config=storage_config)]


class _RowChecker:
    """Rule checks of one index row; failures name the shard and the row."""

    def __init__(self, uri: str, number: int, row: Mapping[str, Any]) -> None:
        self.where = f"{uri} row {number}"
        self.row = row

    def fail(self, message: str) -> NoReturn:
        raise RepresentationIntegrityError(f"{self.where}: {message}")

    def text(self, name: str) -> str:
        value = self.row[name]
        if type(value) is not str or not value:
            self.fail(f"{name} must be a non-empty string, got {value!r}")
        return str(value)

    def positive(self, name: str) -> int:
        value = self.row[name]
        if not is_count(value) or value <= 0:
            self.fail(f"{name} must be a positive integer, got {value!r}")
        return int(value)

    def digest(self, name: str) -> str:
        value = self.row[name]
        if not is_sha256_hex(value):
            self.fail(f"{name} must be a lowercase hex SHA-256, got {value!r}")
        return str(value)

    def object_uri(self, name: str) -> str:
        value = self.text(name)
        try:
            _, key = s3_bucket_key(value)
        except ValueError:
            key = ""
        if not key or key.endswith("/"):
            self.fail(f"{name} must be an s3://bucket/key URI, got {value!r}")
        return value

    def nulls(self, names: Sequence[str], kind: str) -> None:
        filled = [name for name in names if self.row[name] is not None]
        if filled:
            self.fail(f"a {kind} row must have null {', '.join(filled)}")


@dataclass(frozen=True)
class IndexPair:
    role: str
    source: str
    split: str
    tensor: Claim
    metadata: Claim
    tensor_records: int
    metadata_records: int
    where: str


@dataclass(frozen=True)
class IndexSingleton:
    role: str
    claim: Claim
    where: str


def _check_index_row(
    uri: str, number: int, split: str, row: Mapping[str, Any]
) -> IndexPair | IndexSingleton:
    if set(row) != set(INDEX_COLUMNS):
        missing = sorted(set(INDEX_COLUMNS) - set(row))
        extra = sorted(set(row) - set(INDEX_COLUMNS))
        integrity_error(
            uri,
            f"index columns must be exactly {', '.join(INDEX_COLUMNS)} "
            f"(missing: {', '.join(missing) or '-'}; unexpected: {', '.join(extra) or '-'})",
        )
    check = _RowChecker(uri, number, row)
    if row["split"] != split:
        check.fail(f"split is {row['split']!r} in the {split!r} index")
    kind = row["entry_kind"]
    if kind == "paired_artifact":
        role = check.text("role")
        if role not in PAIR_ROLES:
            check.fail(f"role {role!r} is not one of {', '.join(PAIR_ROLES)}")
        source = check.text("source")
        if source not in SOURCES:
            check.fail(f"source {source!r} is not one of {', '.join(SOURCES)}")
        for name in ("tensor_offset", "metadata_offset"):
            if not is_count(row[name]) or row[name] != 0:
                check.fail(f"{name} must be 0, got {row[name]!r}")
        counts = {}
        for prefix in ("tensor", "metadata"):
            records = check.positive(f"{prefix}_records")
            total = check.positive(f"{prefix}_total_records")
            if records != total:
                check.fail(f"{prefix}_records {records} differs from {prefix}_total_records")
            counts[prefix] = records
        tensor_uri = check.object_uri("safetensors_uri")
        if not tensor_uri.endswith(".safetensors"):
            check.fail(f"safetensors_uri {tensor_uri} does not end in .safetensors")
        metadata_uri = check.object_uri("metadata_uri")
        if metadata_uri != tensor_uri.removesuffix(".safetensors") + ".parquet":
            check.fail(f"metadata_uri {metadata_uri} is not {tensor_uri} with .parquet")
        check.nulls(SINGLETON_FIELDS, "paired_artifact")
        return IndexPair(
            role=role,
            source=source,
            split=split,
            tensor=Claim(
                tensor_uri,
                check.positive("safetensors_size_bytes"),
                check.digest("safetensors_sha256"),
            ),
            metadata=Claim(
                metadata_uri, check.positive("metadata_size_bytes"), check.digest("metadata_sha256")
            ),
            tensor_records=counts["tensor"],
            metadata_records=counts["metadata"],
            where=check.where,
        )
    if kind == "singleton_artifact":
        if row["source"] != SINGLETON_SOURCE:
            check.fail(f"source is {row['source']!r}; a singleton must have {SINGLETON_SOURCE}")
        if row["split"] != SINGLETON_SPLIT:
            check.fail(f"split is {row['split']!r}; a singleton must have {SINGLETON_SPLIT}")
        role = check.text("role")
        check.nulls(PAIR_FIELDS, "singleton_artifact")
        return IndexSingleton(
            role=role,
            claim=Claim(
                check.object_uri("singleton_uri"),
                check.positive("singleton_size_bytes"),
                check.digest("singleton_sha256"),
            ),
            where=check.where,
        )
    check.fail(f"entry_kind {kind!r} is neither paired_artifact nor singleton_artifact")


def check_index(
    rows_by_split: Mapping[str, list[dict[str, Any]]],
    shards: Mapping[str, ManifestShard],
    prefix: str,
) -> tuple[list[IndexPair], list[IndexSingleton], Claim]:
    """Pairs, singletons and the artifact manifest's claim, after the index rules."""
    pairs: list[IndexPair] = []
    singletons: list[IndexSingleton] = []
    for split in SPLITS:
        uri = shards[split].uri
        for number, row in enumerate(rows_by_split[split]):
            entry = _check_index_row(uri, number, split, row)
            if isinstance(entry, IndexPair):
                pairs.append(entry)
            else:
                singletons.append(entry)
    claimed = Counter(
        uri
        for uri in [
            *(claim.uri for pair in pairs for claim in (pair.tensor, pair.metadata)),
            *(singleton.claim.uri for singleton in singletons),
        ]
    )
    repeated = sorted(uri for uri, count in claimed.items() if count > 1)
    if repeated:
        integrity_error(shards["analysis"].uri, f"the index claims {repeated[0]} more than once")
    manifests = [s for s in singletons if s.role == "artifact_manifest"]
    if len(manifests) != 1:
        integrity_error(
            shards["analysis"].uri,
            f"the index has {len(manifests)} artifact_manifest rows; exactly one is required",
        )
    expected = f"{prefix}{ARTIFACT_MANIFEST_NAME}"
    if manifests[0].claim.uri != expected:
        integrity_error(
            shards["analysis"].uri,
            f"the artifact manifest is claimed at {manifests[0].claim.uri}, not {expected}",
        )
    return pairs, singletons, manifests[0].claim
