"""One descriptor per shard format (SPEC sections 3 and 4): what a publisher, a reader and the
loader need to know of it, in one place, so nothing else branches on a format's name. Adding a
format is a descriptor here and its codec.

- ``suffix``, ``content_type``, ``attributes``: how a shard object is named and tagged.
- ``codec``: who encodes and decodes it: ``"native"`` (the Rust codecs of ``_native``, records
  as frames or lines) or ``"arrow"`` (pyarrow, by row group: :mod:`.parquet`).
- ``single_put``: a deterministic shard is one create-only PUT, so it must stay under 5 GiB.
- ``index``: the kind of index that lets a reader enter a shard by block, written beside each
  shard by the saver, built by ``syvain-data index``, read by the loader: ``"frame_offsets"``
  (msgpack.zstf: the byte offset of every n-th record, ``formats.shard_index``) or
  ``"access_points"`` (jsonl.gz: where each block enters the gzip stream, with the window
  there, ``formats.gzip_index``); None for Parquet (its row groups come from its footer).
- ``footer_blocks``: the format is entered by block through the shard's own footer (Parquet:
  its row groups, and inside them its pages where the file has an offset index, which our
  writer adds), with no index object; the seeded order cuts its shards into blocks when the
  first shard has an offset index.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from syvain_training_data.manifest import DATA_FORMATS, DataManifestDataFormat

__all__ = ["FORMATS", "ShardFormat", "check_data_format", "shard_format"]


@dataclass(frozen=True)
class ShardFormat:
    """What the package knows of one shard format (see the module docstring)."""

    name: DataManifestDataFormat
    suffix: str
    content_type: str
    attributes: Mapping[str, str] = field(default_factory=dict)
    codec: Literal["native", "arrow"] = "native"
    single_put: bool = False
    index: Literal["frame_offsets", "access_points"] | None = None
    footer_blocks: bool = False

    @property
    def record_index(self) -> bool:
        """The format has an index a reader can enter a shard by (see ``index``)."""
        return self.index is not None


FORMATS: Final[Mapping[str, ShardFormat]] = {
    "jsonl.gz": ShardFormat(
        name="jsonl.gz",
        suffix=".jsonl.gz",
        content_type="application/gzip",
        attributes={"content-format": "jsonl", "compression": "gzip"},
        index="access_points",
    ),
    "parquet": ShardFormat(
        name="parquet",
        suffix=".parquet",
        content_type="application/vnd.apache.parquet",
        attributes={"content-format": "parquet", "compression": "zstd"},
        codec="arrow",
        single_put=True,
        footer_blocks=True,
    ),
    "msgpack.zstf": ShardFormat(
        name="msgpack.zstf",
        suffix=".msgpack.zstf",
        content_type="application/msgpack",
        attributes={"content-format": "msgpack.zstf", "compression": "zstd-framed"},
        single_put=True,
        index="frame_offsets",
    ),
}
assert tuple(FORMATS) == DATA_FORMATS, "one descriptor per manifest data format"


def check_data_format(data_format: object) -> None:
    """ValueError unless ``data_format`` is one of the manifest's data formats (SPEC section 2),
    naming them."""
    if data_format not in FORMATS:
        raise ValueError(
            f"Unknown data format {data_format!r}; expected one of {', '.join(FORMATS)}"
        )


def shard_format(data_format: object) -> ShardFormat:
    """The descriptor of ``data_format``; the ValueError of :func:`check_data_format`."""
    check_data_format(data_format)
    return FORMATS[data_format]  # type: ignore[index]
