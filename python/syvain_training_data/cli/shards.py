"""Which shards of a manifest a command handles: every distinct one, or those of a split or
curriculum stage (``--split``, ``--stage``)."""

from __future__ import annotations

from syvain_training_data.cli.context import Context
from syvain_training_data.cli.errors import UsageError
from syvain_training_data.manifest import DataManifest, ManifestShard


def unique_shards(manifest: DataManifest) -> list[ManifestShard]:
    """Every distinct shard of the manifest, in manifest order (stages list split shards)."""
    seen: dict[str, ManifestShard] = {}
    for entry in manifest.splits.values():
        for shard in entry.shards:
            seen.setdefault(shard.uri, shard)
    return list(seen.values())


def selected_shards(ctx: Context, manifest: DataManifest) -> tuple[str, list[ManifestShard]]:
    """(split, its shards or those of ``--stage``) from ``--split`` (default: the first)."""
    split = ctx.args.split or next(iter(manifest.splits))
    entry = manifest.splits.get(split)
    if entry is None:
        raise UsageError(f"unknown split {split!r}; available splits: {', '.join(manifest.splits)}")
    shards = entry.shards
    if ctx.args.stage is not None:
        stage = entry.curriculum.get(ctx.args.stage)
        if stage is None:
            available = ", ".join(entry.curriculum) or "(none)"
            raise UsageError(
                f"unknown curriculum stage {ctx.args.stage!r} in split {split!r}; "
                f"available stages: {available}"
            )
        shards = stage.shards
    return split, list(shards)
