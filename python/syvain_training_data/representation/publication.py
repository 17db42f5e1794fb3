"""The publication's chain of custody above the tensors (SPEC section 7): data manifest, index
shards and artifact manifest, checked against each other into a :class:`Publication`.

The manifest is pinned by the caller's SHA-256; it pins the three index shards by size and
etag; the index claims every artifact's size and SHA-256, and those claims must equal the
artifact manifest's inventory (itself pinned by its index claim). Every rule failure raises
:class:`RepresentationIntegrityError` naming the object, and the row where there is one.

Decisions where the SPEC is silent:

- An ``entry_kind`` other than ``paired_artifact`` or ``singleton_artifact`` is an error.
- Artifact URIs must be ``s3://bucket/key``; they need not be under the publication prefix
  (custody comes from the claimed digests, not from the location).
- The artifact manifest may hold keys the SPEC does not name (at the top level, in objects,
  tensors and parquet entries); the named ones must be present with the right JSON types. It
  must not list itself (it cannot hold its own digest).
- A task id appears at most once per split and role, and a prepared task and the
  representation task of the same id have the same source: otherwise the join is ambiguous.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NoReturn

from syvain_training_data.errors import RepresentationIntegrityError
from syvain_training_data.manifest import (
    DataManifest,
    ManifestShard,
    canonical_manifest_bytes,
    parse_manifest,
)
from syvain_training_data.representation.custody import (
    Claim,
    Workspace,
    custody_errors,
    fetch,
    integrity_error,
)
from syvain_training_data.shard import iter_shard
from syvain_training_data.storage import StorageConfig, head_object
from syvain_training_data.strict_json import loads_strict_json
from syvain_training_data.uris import check_shard_scheme, plain_etag, s3_bucket_key

__all__ = [
    "ARTIFACT_MANIFEST_SCHEMA",
    "INDEX_COLUMNS",
    "MANIFEST_URI_PATTERN",
    "PAIR_ROLES",
    "SOURCES",
    "SPLITS",
    "Claim",
    "Pair",
    "Publication",
    "load_publication",
    "publication_prefix",
]

SPLITS: Final = ("basis_fit", "analysis", "validation")
SOURCES: Final = ("common_pile", "broad_replay", "dolmino", "longmino")
#: A pair's tensor role -> the role of its metadata object.
PAIR_ROLES: Final[Mapping[str, str]] = {
    "prepared_blocks": "prepared_metadata",
    "representations": "representation_metadata",
    "qkv_relations": "qkv_metadata",
}
#: A pair's tensor role -> the tensor whose shape[0] is the pair's row count.
ROW_TENSORS: Final[Mapping[str, str]] = {
    "prepared_blocks": "input_ids",
    "representations": "projection",
    "qkv_relations": "qkv_sketch",
}
MANIFEST_URI_PATTERN: Final = re.compile(
    r"s3://syvain-data/shared-data/distill-olmo3-representation-v1/"
    r"(?P<recipe>[0-9a-f]{64})/publication-v2/data-manifest-v1\.json"
)
ARTIFACT_MANIFEST_SCHEMA: Final = "syvain-distill-olmo3-representation-artifact-manifest-v2"
ARTIFACT_MANIFEST_NAME: Final = "artifact-manifest-v2.json"
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

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def is_sha256_hex(value: object) -> bool:
    """True for a str of 64 lowercase hex digits."""
    return type(value) is str and _SHA256_HEX.fullmatch(value) is not None


def _is_count(value: object) -> bool:
    return type(value) is int


def publication_prefix(manifest_uri: str) -> tuple[str, str]:
    """(recipe_sha256, prefix) of a canonical manifest URI; ValueError for any other URI."""
    match = MANIFEST_URI_PATTERN.fullmatch(manifest_uri)
    if match is None:
        raise ValueError(
            "manifest_uri must be s3://syvain-data/shared-data/distill-olmo3-representation-v1/"
            "{recipe_sha256}/publication-v2/data-manifest-v1.json with a lowercase hex "
            f"recipe_sha256, got {manifest_uri!r}"
        )
    return match["recipe"], manifest_uri[: -len("data-manifest-v1.json")]


@dataclass(frozen=True)
class Pair:
    """A paired artifact: a tensor file and its metadata table, for one task of a split."""

    role: str
    source: str
    split: str
    task: str
    tensor: Claim
    metadata: Claim
    tensor_records: int
    metadata_records: int
    #: Tensor name -> shape, as the artifact manifest declares them.
    declared_shapes: Mapping[str, tuple[int, ...]]


@dataclass(frozen=True)
class Publication:
    """The checked publication: its recipe, prefix and paired artifacts."""

    recipe_sha256: str
    prefix: str
    pairs: tuple[Pair, ...]

    def prepared(self, split: str, source: str) -> list[Pair]:
        """The prepared-block pairs of a source in a split, sorted by task id."""
        return sorted(
            (
                pair
                for pair in self.pairs
                if pair.role == "prepared_blocks" and pair.split == split and pair.source == source
            ),
            key=lambda pair: pair.task,
        )

    def representations(self, split: str, task: str) -> Pair:
        """The representation pair of a task in a split (the index checks made it unique)."""
        for pair in self.pairs:
            if pair.role == "representations" and pair.split == split and pair.task == task:
                return pair
        raise KeyError((split, task))


# --------------------------------------------------------------------------------------------
# Data manifest
# --------------------------------------------------------------------------------------------


def _check_manifest(data: bytes, uri: str, prefix: str) -> dict[str, ManifestShard]:
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


# --------------------------------------------------------------------------------------------
# Index
# --------------------------------------------------------------------------------------------


def _read_index(
    split: str, shard: ManifestShard, storage_config: StorageConfig
) -> list[dict[str, Any]]:
    """The rows of one index shard, read with the HEAD, size, etag and row-count checks."""
    with custody_errors(shard.uri):
        info = head_object(shard.uri, storage_config=storage_config)
        if info.size != shard.size_bytes:
            integrity_error(
                shard.uri,
                f"the index shard has {info.size} bytes but the manifest says {shard.size_bytes}",
            )
        if info.etag and plain_etag(info.etag) != plain_etag(shard.etag):
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
        if not _is_count(value) or value <= 0:
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
class _IndexPair:
    role: str
    source: str
    split: str
    tensor: Claim
    metadata: Claim
    tensor_records: int
    metadata_records: int
    where: str


@dataclass(frozen=True)
class _IndexSingleton:
    role: str
    claim: Claim
    where: str


def _check_index_row(
    uri: str, number: int, split: str, row: Mapping[str, Any]
) -> _IndexPair | _IndexSingleton:
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
            if not _is_count(row[name]) or row[name] != 0:
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
        return _IndexPair(
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
        return _IndexSingleton(
            role=role,
            claim=Claim(
                check.object_uri("singleton_uri"),
                check.positive("singleton_size_bytes"),
                check.digest("singleton_sha256"),
            ),
            where=check.where,
        )
    check.fail(f"entry_kind {kind!r} is neither paired_artifact nor singleton_artifact")


def _check_index(
    rows_by_split: Mapping[str, list[dict[str, Any]]],
    shards: Mapping[str, ManifestShard],
    prefix: str,
) -> tuple[list[_IndexPair], list[_IndexSingleton], Claim]:
    """Pairs, singletons and the artifact manifest's claim, after the index rules."""
    pairs: list[_IndexPair] = []
    singletons: list[_IndexSingleton] = []
    for split in SPLITS:
        uri = shards[split].uri
        for number, row in enumerate(rows_by_split[split]):
            entry = _check_index_row(uri, number, split, row)
            if isinstance(entry, _IndexPair):
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


# --------------------------------------------------------------------------------------------
# Artifact manifest
# --------------------------------------------------------------------------------------------


def _parse_artifact_manifest(data: bytes, uri: str) -> dict[str, Any]:
    try:
        value = loads_strict_json(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise RepresentationIntegrityError(
            f"{uri}: the artifact manifest is not valid JSON: {error}"
        ) from error
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if (canonical + "\n").encode("utf-8") != data:
        integrity_error(
            uri,
            "the artifact manifest is not canonical JSON (sorted keys, separators ',' and ':', "
            "non-ASCII kept, one final newline)",
        )
    if type(value) is not dict:
        integrity_error(uri, "the artifact manifest is not a JSON object")
    return value


@dataclass(frozen=True)
class _InventoryObject:
    uri: str
    size: int
    sha256: str
    role: str
    source: str | None
    split: str | None
    tensors: tuple[tuple[str, tuple[int, ...]], ...] | None
    parquet_rows: int | None


def _inventory_object(uri: str, number: int, entry: object) -> _InventoryObject:
    where = f"{uri} objects[{number}]"

    def fail(message: str) -> NoReturn:
        raise RepresentationIntegrityError(f"{where}: {message}")

    if type(entry) is not dict:
        fail("is not a JSON object")
    item: dict[str, Any] = entry
    for name, kind in (("uri", str), ("bytes", int), ("sha256", str), ("role", str)):
        if type(item.get(name)) is not kind:
            fail(f"{name} must be a {kind.__name__}, got {item.get(name)!r}")
    for name in ("source", "split"):
        if name in item and type(item[name]) is not str:
            fail(f"{name} must be a str, got {item[name]!r}")
    tensors = None
    if "tensors" in item:
        if type(item["tensors"]) is not list:
            fail("tensors must be a list")
        described = []
        for tensor in item["tensors"]:
            if type(tensor) is not dict or type(tensor.get("name")) is not str:
                fail(f"a tensors entry must be an object with a str name: {tensor!r}")
            shape = tensor.get("shape")
            if type(shape) is not list or not all(_is_count(d) and d >= 0 for d in shape):
                fail(f"tensor {tensor['name']!r} has an invalid shape {shape!r}")
            described.append((str(tensor["name"]), tuple(int(d) for d in shape)))
        tensors = tuple(described)
    parquet_rows = None
    if "parquet" in item:
        parquet = item["parquet"]
        if type(parquet) is not dict or not _is_count(parquet.get("rows")) or parquet["rows"] < 0:
            fail(f"parquet must be an object with a non-negative int rows: {parquet!r}")
        parquet_rows = int(parquet["rows"])
    return _InventoryObject(
        uri=item["uri"],
        size=item["bytes"],
        sha256=item["sha256"],
        role=item["role"],
        source=item.get("source"),
        split=item.get("split"),
        tensors=tensors,
        parquet_rows=parquet_rows,
    )


def _check_artifact_manifest(
    data: bytes, claim: Claim, recipe_sha256: str
) -> dict[str, _InventoryObject]:
    """The inventory by URI, after the artifact manifest's own rules."""
    uri = claim.uri
    value = _parse_artifact_manifest(data, uri)
    if value.get("schema") != ARTIFACT_MANIFEST_SCHEMA:
        integrity_error(uri, f"schema is {value.get('schema')!r}, not {ARTIFACT_MANIFEST_SCHEMA}")
    if type(value.get("schema_version")) is not int or value["schema_version"] != 2:
        integrity_error(uri, f"schema_version is {value.get('schema_version')!r}, not 2")
    if value.get("recipe_sha256") != recipe_sha256:
        integrity_error(
            uri, f"recipe_sha256 is {value.get('recipe_sha256')!r}, not the recipe {recipe_sha256}"
        )
    objects = value.get("objects")
    if type(objects) is not list:
        integrity_error(uri, "objects must be a list")
    inventory: dict[str, _InventoryObject] = {}
    for number, entry in enumerate(objects):
        item = _inventory_object(uri, number, entry)
        if item.uri in inventory:
            integrity_error(uri, f"objects lists {item.uri} more than once")
        inventory[item.uri] = item
    totals = {"objects": len(inventory), "bytes": sum(item.size for item in inventory.values())}
    declared = value.get("totals")
    if (
        type(declared) is not dict
        or declared != totals
        or any(type(v) is not int for v in declared.values())
    ):
        integrity_error(uri, f"totals are {declared!r}; the objects add up to {totals}")
    if uri in inventory:
        integrity_error(uri, "the artifact manifest lists itself among its objects")
    return inventory


def _check_claims(
    pairs: list[_IndexPair],
    singletons: list[_IndexSingleton],
    inventory: Mapping[str, _InventoryObject],
    manifest_claim: Claim,
) -> None:
    """The index's claims equal the inventory plus the artifact manifest itself."""
    claims = {claim.uri: claim for pair in pairs for claim in (pair.tensor, pair.metadata)}
    claims.update((s.claim.uri, s.claim) for s in singletons)
    unlisted = sorted(set(claims) - set(inventory) - {manifest_claim.uri})
    if unlisted:
        integrity_error(
            manifest_claim.uri,
            f"the index claims {unlisted[0]} ({len(unlisted)} in all) but the inventory does "
            "not list it",
        )
    unclaimed = sorted(set(inventory) - set(claims))
    if unclaimed:
        integrity_error(
            manifest_claim.uri,
            f"the inventory lists {unclaimed[0]} ({len(unclaimed)} in all) but the index does "
            "not claim it",
        )
    for claim in claims.values():
        item = inventory.get(claim.uri)
        if item is not None and (item.size, item.sha256) != (claim.size, claim.sha256):
            integrity_error(
                claim.uri,
                f"the index claims {claim.size} bytes with SHA-256 {claim.sha256}, the "
                f"inventory {item.size} bytes with SHA-256 {item.sha256}",
            )
    for singleton in singletons:
        item = inventory.get(singleton.claim.uri)
        if item is not None and item.role != singleton.role:
            integrity_error(
                singleton.claim.uri,
                f"the index gives role {singleton.role!r}, the inventory {item.role!r}",
            )


def _task_id(pair: _IndexPair) -> str:
    """prepared_blocks: the file name without .safetensors; representations: the folder of
    representations.safetensors; qkv_relations: the tensor URI itself (not joined)."""
    path = pair.tensor.uri.removeprefix("s3://").split("/")
    if pair.role == "prepared_blocks":
        return path[-1].removesuffix(".safetensors")
    if pair.role == "representations":
        if path[-1] != "representations.safetensors" or len(path) < 3:
            integrity_error(
                pair.tensor.uri,
                "a representations file must be {task}/representations.safetensors",
            )
        return path[-2]
    return pair.tensor.uri


def _check_pair(pair: _IndexPair, inventory: Mapping[str, _InventoryObject]) -> Pair:
    """The pair's inventory roles, source, split and row counts."""
    tensor, metadata = inventory[pair.tensor.uri], inventory[pair.metadata.uri]
    for item, role in ((tensor, pair.role), (metadata, PAIR_ROLES[pair.role])):
        found = (item.role, item.source, item.split)
        if found != (role, pair.source, pair.split):
            integrity_error(
                item.uri,
                f"the inventory gives role, source, split {found}; the index row "
                f"({pair.where}) requires {(role, pair.source, pair.split)}",
            )
    name = ROW_TENSORS[pair.role]
    shapes = [shape for tensor_name, shape in tensor.tensors or () if tensor_name == name]
    if len(shapes) != 1 or not shapes[0]:
        integrity_error(
            tensor.uri, f"the inventory must describe exactly one tensor {name!r} with a shape"
        )
    if shapes[0][0] != pair.tensor_records:
        integrity_error(
            tensor.uri,
            f"the inventory gives {name} {shapes[0][0]} rows; the index {pair.tensor_records}",
        )
    if metadata.parquet_rows != pair.metadata_records:
        integrity_error(
            metadata.uri,
            f"the inventory gives {metadata.parquet_rows} parquet rows; the index "
            f"{pair.metadata_records}",
        )
    return Pair(
        role=pair.role,
        source=pair.source,
        split=pair.split,
        task=_task_id(pair),
        tensor=pair.tensor,
        metadata=pair.metadata,
        tensor_records=pair.tensor_records,
        metadata_records=pair.metadata_records,
        declared_shapes=dict(tensor.tensors or ()),
    )


def _check_tasks(pairs: list[Pair], index_uri: Mapping[str, str]) -> None:
    """Per split, the prepared and representation task sets are equal, each id once per role,
    and the two tasks of an id have the same source."""
    for split in SPLITS:
        by_role: dict[str, dict[str, Pair]] = {"prepared_blocks": {}, "representations": {}}
        for pair in pairs:
            if pair.split != split or pair.role not in by_role:
                continue
            tasks = by_role[pair.role]
            if pair.task in tasks:
                integrity_error(
                    index_uri[split],
                    f"task {pair.task!r} has two {pair.role} artifacts: "
                    f"{tasks[pair.task].tensor.uri} and {pair.tensor.uri}",
                )
            tasks[pair.task] = pair
        prepared, represented = by_role["prepared_blocks"], by_role["representations"]
        if set(prepared) != set(represented):
            only_prepared = sorted(set(prepared) - set(represented))
            only_represented = sorted(set(represented) - set(prepared))
            integrity_error(
                index_uri[split],
                f"the {split!r} prepared_blocks and representations task sets differ "
                f"(only prepared: {', '.join(only_prepared) or '-'}; only representations: "
                f"{', '.join(only_represented) or '-'})",
            )
        for task, pair in prepared.items():
            if represented[task].source != pair.source:
                integrity_error(
                    represented[task].tensor.uri,
                    f"task {task!r} is {pair.source!r} in prepared_blocks but "
                    f"{represented[task].source!r} in representations",
                )


# --------------------------------------------------------------------------------------------
# The whole chain
# --------------------------------------------------------------------------------------------


def load_publication(
    manifest_uri: str,
    manifest_sha256: str,
    workspace: Workspace,
    *,
    storage_config: StorageConfig,
) -> Publication:
    """Reads and checks the manifest, the index and the artifact manifest.

    Raises:
        ValueError: ``manifest_uri`` is not the canonical publication URI.
        FileNotFoundError: there is no manifest at ``manifest_uri``.
        RepresentationIntegrityError: any rule of the chain fails (see the module docs).
        PermissionError, StorageRetryExhaustedError, OSError: from the store and the disk.
    """
    recipe_sha256, prefix = publication_prefix(manifest_uri)
    path = fetch(
        manifest_uri,
        workspace,
        storage_config=storage_config,
        sha256=manifest_sha256,
        what="data manifest",
        missing_is_integrity=False,
    )
    shards = _check_manifest(_read_and_remove(path), manifest_uri, prefix)
    # The three shards are small: read them at once (the store calls release the GIL).
    with ThreadPoolExecutor(max_workers=len(SPLITS), thread_name_prefix="syvain-index") as pool:
        reads = {
            split: pool.submit(_read_index, split, shards[split], storage_config)
            for split in SPLITS
        }
        rows = {split: reads[split].result() for split in SPLITS}
    index_pairs, singletons, manifest_claim = _check_index(rows, shards, prefix)
    path = fetch(
        manifest_claim.uri,
        workspace,
        storage_config=storage_config,
        size=manifest_claim.size,
        sha256=manifest_claim.sha256,
        what="artifact manifest",
    )
    inventory = _check_artifact_manifest(_read_and_remove(path), manifest_claim, recipe_sha256)
    _check_claims(index_pairs, singletons, inventory, manifest_claim)
    pairs = [_check_pair(pair, inventory) for pair in index_pairs]
    _check_tasks(pairs, {split: shard.uri for split, shard in shards.items()})
    return Publication(recipe_sha256=recipe_sha256, prefix=prefix, pairs=tuple(pairs))


def _read_and_remove(path: Path) -> bytes:
    data = path.read_bytes()
    path.unlink()
    return data
