"""Which shards a split, a curriculum stage or a union of stages reads (SPEC section 6).

A pure function of the manifest (no torch, no I/O), shared by the PyTorch loader and the Ray
datasource.
"""

from __future__ import annotations

from collections.abc import Sequence

from syvain_training_data.manifest import DataManifest, ManifestShard

__all__ = ["select_shards"]


def select_shards(
    manifest: DataManifest,
    split: str,
    curriculum_stage: str | None = None,
    curriculum_stages: Sequence[str] | None = None,
) -> tuple[list[ManifestShard], list[list[int]], list[str]]:
    """(shards, per stage the indices of its shards, stage names): a shard listed by several
    stages belongs to the first; no stage argument selects the whole split.

    Raises ValueError for an unknown split or stage (naming the available ones), both stage
    arguments, or ``curriculum_stages`` given as a str, empty, or with duplicates.
    """
    entry = manifest.splits.get(split)
    if entry is None:
        available = ", ".join(sorted(manifest.splits))
        raise ValueError(f"Unknown split {split!r}; available splits: {available}")
    if curriculum_stage is not None and curriculum_stages is not None:
        raise ValueError("Pass curriculum_stage or curriculum_stages, not both")
    if curriculum_stages is None:
        if curriculum_stage is None:
            return list(entry.shards), [list(range(len(entry.shards)))], []
        stages = [curriculum_stage]
    else:
        if isinstance(curriculum_stages, str):
            raise ValueError(
                "curriculum_stages must be a sequence of stage names, not a str "
                f"({curriculum_stages!r}); use curriculum_stage for one stage"
            )
        stages = list(curriculum_stages)
        if not stages:
            raise ValueError("curriculum_stages must not be empty")
        repeated = sorted({stage for stage in stages if stages.count(stage) > 1})
        if repeated:
            raise ValueError(f"Duplicate curriculum stages: {', '.join(repeated)}")
    selected: list[ManifestShard] = []
    groups: list[list[int]] = []
    seen: set[str] = set()
    for stage in stages:
        found = entry.curriculum.get(stage)
        if found is None:
            available = ", ".join(sorted(entry.curriculum)) or "(none)"
            raise ValueError(
                f"Unknown curriculum stage {stage!r} in split {split!r}; "
                f"available stages: {available}"
            )
        group = []
        for shard in found.shards:
            if shard.uri not in seen:
                seen.add(shard.uri)
                group.append(len(selected))
                selected.append(shard)
        groups.append(group)
    return selected, groups, stages
