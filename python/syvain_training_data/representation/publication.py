"""The publication's chain of custody above the tensors (SPEC section 7): data manifest, index
shards and artifact manifest, checked against each other into a :class:`Publication`.

The manifest is pinned by the caller's SHA-256; it pins the three index shards by size and
etag (:mod:`.index`); the index claims every artifact's size and SHA-256, and those claims
must equal the artifact manifest's inventory (:mod:`.artifact_manifest`, itself pinned by its
index claim). Every rule failure raises :class:`RepresentationIntegrityError` naming the
object, and the row where there is one.

Decision where the SPEC is silent: a task id appears at most once per split and role, and a
prepared task and the representation task of the same id have the same source: otherwise the
join is ambiguous.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from syvain_training_data.representation.artifact_manifest import (
    InventoryObject,
    check_artifact_manifest,
)
from syvain_training_data.representation.custody import Claim, Workspace, fetch, integrity_error
from syvain_training_data.representation.index import (
    IndexPair,
    IndexSingleton,
    check_index,
    check_manifest,
    read_index,
)
from syvain_training_data.representation.layout import PAIR_ROLES, SPLITS, publication_prefix
from syvain_training_data.storage import StorageConfig
from syvain_training_data.uris import s3_bucket_key

__all__ = ["Pair", "Publication", "load_publication"]

#: A pair's tensor role -> the tensor whose shape[0] is the pair's row count.
ROW_TENSORS: Final[Mapping[str, str]] = {
    "prepared_blocks": "input_ids",
    "representations": "projection",
    "qkv_relations": "qkv_sketch",
}


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


def _check_claims(
    pairs: list[IndexPair],
    singletons: list[IndexSingleton],
    inventory: Mapping[str, InventoryObject],
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


def _task_id(pair: IndexPair) -> str:
    """prepared_blocks: the file name without .safetensors; representations: the folder of
    representations.safetensors; qkv_relations: the tensor URI itself (not joined)."""
    _, key = s3_bucket_key(pair.tensor.uri)  # the index row checks made it an object URI
    path = key.split("/")
    if pair.role == "prepared_blocks":
        return path[-1].removesuffix(".safetensors")
    if pair.role == "representations":
        if path[-1] != "representations.safetensors" or len(path) < 2:
            integrity_error(
                pair.tensor.uri,
                "a representations file must be {task}/representations.safetensors",
            )
        return path[-2]
    return pair.tensor.uri


def _check_pair(pair: IndexPair, inventory: Mapping[str, InventoryObject]) -> Pair:
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
        RepresentationIntegrityError: any rule of the chain fails (see the module docs here,
            in :mod:`.index` and in :mod:`.artifact_manifest`).
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
    shards = check_manifest(_read_and_remove(path), manifest_uri, prefix)
    # The three shards are small: read them at once (the store calls release the GIL).
    with ThreadPoolExecutor(max_workers=len(SPLITS), thread_name_prefix="syvain-index") as pool:
        reads = {
            split: pool.submit(read_index, split, shards[split], storage_config) for split in SPLITS
        }
        rows = {split: reads[split].result() for split in SPLITS}
    index_pairs, singletons, manifest_claim = check_index(rows, shards, prefix)
    path = fetch(
        manifest_claim.uri,
        workspace,
        storage_config=storage_config,
        size=manifest_claim.size,
        sha256=manifest_claim.sha256,
        what="artifact manifest",
    )
    inventory = check_artifact_manifest(_read_and_remove(path), manifest_claim, recipe_sha256)
    _check_claims(index_pairs, singletons, inventory, manifest_claim)
    pairs = [_check_pair(pair, inventory) for pair in index_pairs]
    _check_tasks(pairs, {split: shard.uri for split, shard in shards.items()})
    return Publication(recipe_sha256=recipe_sha256, prefix=prefix, pairs=tuple(pairs))


def _read_and_remove(path: Path) -> bytes:
    data = path.read_bytes()
    path.unlink()
    return data
