"""Building a manifest from the shards a saver knows (SPEC sections 2 and 5): splits in order,
curriculum stages with their metadata, expected shard sets checked."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from syvain_training_data.manifest import DataManifest, ManifestShard
from syvain_training_data.publish.descriptor import ShardEntry

__all__ = ["Saved", "build_manifest", "check_expected", "uris_of"]


@dataclass(frozen=True)
class Saved(ShardEntry):
    """A shard known to a saver: what the manifest says about it."""

    deterministic: bool


# (split, stage) -> (ordered shard URIs, canonical metadata text or None)
Curricula = Mapping[tuple[str, str], tuple[tuple[str, ...], str | None]]


def uris_of(shards: Sequence[ManifestShard | str], what: str) -> list[str]:
    """The URIs of a selection of shards; TypeError or ValueError for a str, an empty selection
    or a repeated shard."""
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


def check_expected(
    saved: Mapping[str, Saved],
    expected: Mapping[tuple[str, str | None], frozenset[str]],
    shard_uri: Callable[[str, str | None, str], str],
) -> None:
    """ValueError naming every expected shard ID that is missing and every deterministic
    shard found where a complete set was expected."""
    problems = []
    for (split, stage), ids in sorted(expected.items(), key=lambda item: repr(item[0])):
        wanted = {shard_uri(split, stage, shard_id): shard_id for shard_id in ids}
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


def build_manifest(
    data_format: str,
    saved: Mapping[str, Saved],
    curricula: Curricula,
    orders: Mapping[str, tuple[str, ...]],
) -> DataManifest:
    """The manifest of the ``saved`` shards, with the registered stage selections and split
    orders (sorted by URI where none is registered). Raises the ValueErrors of
    ``DatasetSaver.build_manifest``."""
    if not saved:
        raise ValueError("Cannot commit a manifest with no saved shards")
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
            curriculum[stage] = _stage_entry(split, stage, in_split, curricula.get((split, stage)))
        split_shards = [in_split[uri].shard for uri in order]
        splits[split] = {
            "records": sum(shard.records for shard in split_shards),
            "shards": split_shards,
            "curriculum": curriculum,
        }
    return DataManifest.model_validate({"version": 1, "data_format": data_format, "splits": splits})


def _stage_entry(
    split: str,
    stage: str,
    in_split: Mapping[str, Saved],
    registered: tuple[tuple[str, ...], str | None] | None,
) -> dict[str, Any]:
    members = {uri: s for uri, s in in_split.items() if s.stage == stage}
    values = [s.metadata for s in members.values()]
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
            raise ValueError(f"Shards not saved in split {split!r}: {', '.join(missing)}")
        metadata = _stage_metadata(stage, values) if members else {}
        if registered_metadata is not None:
            if any(v is not None for v in values) and metadata != json.loads(registered_metadata):
                raise ValueError(f"Inconsistent curriculum metadata for stage {stage!r}")
            metadata = json.loads(registered_metadata)
    stage_shards = [in_split[uri].shard for uri in stage_uris]
    return {
        "records": sum(shard.records for shard in stage_shards),
        "shards": stage_shards,
        "metadata": metadata,
    }
