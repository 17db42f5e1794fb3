"""A manifest for shard files that already exist (``syvain-data adopt``, :func:`adopt`): Parquet,
jsonl.gz or msgpack.zstf files another tool wrote, on any store, become a dataset that every
loader reads, mixes and resumes.

Each object is HEADed (size, etag) and its records counted: a Parquet file from its footer (a
ranged read or two, no data; its schema must be the first file's unless schema drift is
allowed), a jsonl.gz or msgpack.zstf file by one streaming pass of the loader's own decoder, so
a record counts here exactly when the loader yields it (blank and invalid jsonl lines do not).
The manifest is written create-only, last, as the saver writes one: an equal manifest already
there is accepted, another is a PublicationConflictError.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from syvain_training_data.errors import PublicationConflictError, ShardDataError
from syvain_training_data.formats.parquet.extra import pyarrow_modules
from syvain_training_data.formats.parquet.reader import open_native
from syvain_training_data.formats.registry import FORMATS, shard_format
from syvain_training_data.manifest import (
    MAX_COUNT,
    DataManifest,
    ManifestShard,
    canonical_manifest_bytes,
    parse_manifest,
    read_manifest_bytes,
)
from syvain_training_data.publish.upload import create_or_match
from syvain_training_data.shard import iter_shard_batches
from syvain_training_data.storage import StorageConfig, head_object, list_objects
from syvain_training_data.uris import (
    check_uri,
    portable_etag,
)

__all__ = ["Adopted", "adopt", "adopted_manifest", "count_records", "expand_sources"]

# The reader's end-of-data check, which counting reads the record count from.
_YIELDED = re.compile(r"declared \d+ records but yielded (\d+)")
_GLOB = re.compile(r"[*?\[]")
# The names other tools give each format's files (Dolma's are *.json.gz), for prefix sources.
_SUFFIXES = {
    "parquet": (".parquet",),
    "jsonl.gz": (".jsonl.gz", ".json.gz", ".ndjson.gz"),
    "msgpack.zstf": (".msgpack.zstf",),
}


@dataclass(frozen=True)
class Adopted:
    """One adopted object: its manifest entry, and for Parquet its schema's text."""

    shard: ManifestShard
    schema: str | None = None


def expand_sources(
    sources: Sequence[str], data_format: str, storage_config: StorageConfig | None
) -> list[str]:
    """The object URIs ``sources`` name, sorted, each once: a URI of one object, a prefix
    (ending in ``/``: every object under it named as the format's files are: ``.parquet``;
    ``.jsonl.gz``, ``.json.gz`` or ``.ndjson.gz``; ``.msgpack.zstf``), a glob
    (``*``, ``?``, ``[...]`` in the last segments, matched against a listing of the part before
    the first wildcard), or ``@FILE`` (a local file of such sources, one a line). ValueError
    for a source that names nothing."""
    shard_format(data_format)
    suffixes = _SUFFIXES[data_format]
    found: set[str] = set()
    for source in sources:
        if source.startswith("@"):
            with open(source[1:], encoding="utf-8") as listing:
                lines = [line.strip() for line in listing]
            found.update(expand_sources([x for x in lines if x], data_format, storage_config))
            continue
        wildcard = _GLOB.search(source)
        if wildcard is None and not source.endswith("/"):
            found.add(check_uri(source))
            continue
        base = source[: wildcard.start()] if wildcard else source
        folder = base.rsplit("/", 1)[0]
        listed = [o.uri for o in list_objects(folder, storage_config=storage_config)]
        matched = [
            uri
            for uri in listed
            if (fnmatch.fnmatchcase(uri, source) if wildcard else uri.startswith(source))
            and (wildcard is not None or uri.endswith(suffixes))
        ]
        if not matched:
            raise ValueError(f"adopt: {source} names no {data_format} object")
        found.update(matched)
    return sorted(found)


def count_records(
    data_format: str, uri: str, storage_config: StorageConfig | None
) -> tuple[ManifestShard, str | None]:
    """(the manifest entry of the object at ``uri``, its Parquet schema's text or None).
    ValueError for an empty object; ShardDataError (RuntimeError) for one its format's reader
    refuses, naming it."""
    info = head_object(uri, storage_config=storage_config)
    if info.size == 0:
        raise ValueError(f"adopt: {uri} is empty (0 bytes); a shard holds at least one record")
    etag = portable_etag(uri, info.etag)
    probe = ManifestShard(uri=uri, records=MAX_COUNT, size_bytes=info.size, etag=etag)
    schema = None
    if FORMATS[data_format].codec == "arrow":
        records, schema = _parquet_footer(probe, storage_config, info.etag or None)
    else:
        records = _streamed_count(data_format, probe, storage_config)
    if records == 0:
        raise ValueError(f"adopt: {uri} holds no records")
    return ManifestShard(uri=uri, records=records, size_bytes=info.size, etag=etag), schema


def _parquet_footer(
    shard: ManifestShard, storage_config: StorageConfig | None, etag: str | None
) -> tuple[int, str]:
    """(rows, schema text) from a Parquet file's footer: a ranged read or two, no data, held
    to ``etag`` (the HEAD's)."""
    pa, _ = pyarrow_modules()
    footer = open_native(shard, storage_config, 0, 0, None, None, etag=etag)
    return int(footer.rows), str(pa.schema(footer.plain_schema))


def _streamed_count(
    data_format: str, shard: ManifestShard, storage_config: StorageConfig | None
) -> int:
    """Records the loader's decoder yields from ``shard`` (declared as MAX_COUNT, so that its
    end-of-data check reports how many it found)."""
    counted = 0
    try:
        for batch in iter_shard_batches(data_format, shard, storage_config=storage_config):  # type: ignore[arg-type]
            counted += batch.num_rows
    except ShardDataError as error:
        found = _YIELDED.search(error.reason or "")
        if found is None:
            raise
        return int(found.group(1))
    raise ShardDataError.of(data_format, shard.uri, f"more than {MAX_COUNT} records")


def adopted_manifest(
    data_format: str, split: str, stage: str | None, adopted: Sequence[Adopted]
) -> DataManifest:
    """The manifest of one split (and curriculum stage) of ``adopted`` objects, by URI."""
    shards = sorted((a.shard for a in adopted), key=lambda shard: shard.uri)
    curriculum = {}
    if stage is not None:
        records = sum(s.records for s in shards)
        curriculum[stage] = {"records": records, "shards": shards, "metadata": {}}
    split_entry = {
        "records": sum(s.records for s in shards),
        "shards": shards,
        "curriculum": curriculum,
    }
    return DataManifest.model_validate(
        {"version": 1, "data_format": data_format, "splits": {split: split_entry}}
    )


def adopt(
    sources: Sequence[str],
    *,
    data_format: str,
    split: str,
    out: str,
    stage: str | None = None,
    storage_config: StorageConfig | None = None,
    jobs: int = 4,
    allow_schema_drift: bool = False,
    on_object: Callable[[ManifestShard], None] | None = None,
) -> DataManifest:
    """Writes at ``out`` the manifest of the objects ``sources`` name (see
    :func:`expand_sources`), as split ``split`` (and curriculum stage ``stage``) of
    ``data_format`` shards, and returns it. ``jobs`` objects are counted at once;
    ``on_object`` is called with each entry as it is made (progress).

    Raises:
        ValueError: a source that names nothing, an empty object, a Parquet schema that is not
            the first file's (naming both) unless ``allow_schema_drift``, a bad argument.
        ShardDataError: an object its format's reader refuses (naming it).
        PublicationConflictError: another manifest is already at ``out``.
    """
    shard_format(data_format)
    if not split.strip():
        raise ValueError("adopt: split must be a non-empty name")
    uris = expand_sources(sources, data_format, storage_config)

    def one(uri: str) -> Adopted:
        shard, schema = count_records(data_format, uri, storage_config)
        if on_object is not None:
            on_object(shard)
        return Adopted(shard, schema)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        adopted = list(pool.map(one, uris))
    first = adopted[0]
    for other in adopted[1:]:
        if not allow_schema_drift and other.schema != first.schema:
            raise ValueError(
                f"adopt: the Parquet schema of {other.shard.uri} differs from that of "
                f"{first.shard.uri} (pass allow_schema_drift=True, --allow-schema-drift, to "
                f"adopt them together)\n{first.shard.uri}: {first.schema}\n"
                f"{other.shard.uri}: {other.schema}"
            )
    manifest = adopted_manifest(data_format, split, stage, adopted)
    data = canonical_manifest_bytes(manifest)
    config = storage_config or StorageConfig()

    def same() -> bool:
        return parse_manifest(read_manifest_bytes(out, storage_config=config), out) == manifest

    create_or_match(
        out,
        data,
        config,
        matches=same,
        conflict=lambda: PublicationConflictError(f"A different manifest is already at {out}"),
    )
    return manifest
