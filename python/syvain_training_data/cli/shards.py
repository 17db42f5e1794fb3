"""Which shards of a manifest a command handles: every distinct one, or those of a split or
curriculum stage (``--split``, ``--stage``), chosen as the loader chooses them."""

from __future__ import annotations

from syvain_training_data.cli.context import Context
from syvain_training_data.cli.errors import UsageError
from syvain_training_data.loading.selection import select_shards
from syvain_training_data.manifest import DataManifest, ManifestShard


def unique_shards(manifest: DataManifest) -> list[ManifestShard]:
    """Every distinct shard of the manifest, in manifest order (stages list split shards)."""
    seen: dict[str, ManifestShard] = {}
    for entry in manifest.splits.values():
        for shard in entry.shards:
            seen.setdefault(shard.uri, shard)
    return list(seen.values())


def selected_shards(ctx: Context, manifest: DataManifest) -> tuple[str, list[ManifestShard]]:
    """(split, its shards or those of ``--stage``) from ``--split`` (default: the first), as
    :func:`~syvain_training_data.loading.selection.select_shards` selects them; an unknown split
    or stage is a usage error with the loader's message."""
    split = ctx.args.split or next(iter(manifest.splits))
    try:
        shards, _, _ = select_shards(manifest, split, ctx.args.stage)
    except ValueError as error:
        raise UsageError(str(error)) from None
    return split, shards
