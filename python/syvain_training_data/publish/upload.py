"""Uploading a spooled shard with its format's object attributes (SPEC section 4), create-only
when it is deterministic, and copying a shard from one store to another through a spool."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Final

from syvain_training_data import _native
from syvain_training_data.errors import PublicationConflictError
from syvain_training_data.manifest import DataManifestDataFormat, ManifestShard
from syvain_training_data.publish.spool import Spool, limits
from syvain_training_data.storage import StorageConfig, head_object, native_storage, open_stream
from syvain_training_data.uris import portable_etag

__all__ = ["OBJECT_ATTRIBUTES", "copy_shard", "stream_sha256", "upload_spool"]

logger = logging.getLogger(__name__)

# SPEC section 4: content type and (content-format, compression) metadata per format.
OBJECT_ATTRIBUTES: Final[dict[str, tuple[str, dict[str, str]]]] = {
    "jsonl.gz": ("application/gzip", {"content-format": "jsonl", "compression": "gzip"}),
    "parquet": (
        "application/vnd.apache.parquet",
        {"content-format": "parquet", "compression": "zstd"},
    ),
    "msgpack.zstf": (
        "application/msgpack",
        {"content-format": "msgpack.zstf", "compression": "zstd-framed"},
    ),
}


def upload_spool(
    uri: str,
    spool: Spool,
    data_format: str,
    storage_config: StorageConfig,
    *,
    create_only: bool,
) -> tuple[int, str]:
    """Uploads sealed spooled bytes with the format's object attributes; returns (size, etag).

    In memory: one PUT from the chunks; in a file: the native ``put_file`` (one PUT, or a
    streamed multipart upload). A create-only upload that finds an object holding exactly these
    bytes reuses it; other bytes are a PublicationConflictError.
    """
    content_type, attributes = OBJECT_ATTRIBUTES[data_format]
    client = native_storage(storage_config)
    rules = limits()
    try:
        if spool.path is not None:
            return _native.put_file(
                client,
                uri,
                spool.path,
                content_type=content_type,
                metadata=attributes,
                create_only=create_only,
                single_put_max=rules.deterministic_single_put_bytes,
                multipart_threshold=rules.multipart_threshold,
                part_size=rules.part_size,
            )
        return _native.put_chunks(
            client,
            uri,
            spool.chunks,
            content_type=content_type,
            metadata=attributes,
            create_only=create_only,
        )
    except FileExistsError:
        etag = _check_existing_bytes(uri, spool.size, spool.sha256(), storage_config)
        logger.info("Reusing the identical existing object %s", uri)
        return spool.size, etag


def _check_existing_bytes(uri: str, size: int, sha256: str, storage_config: StorageConfig) -> str:
    """The etag of an existing object that holds exactly our bytes; else a conflict."""
    info = head_object(uri, storage_config=storage_config)
    if info.size != size or stream_sha256(uri, info.size, info.etag, storage_config) != sha256:
        raise PublicationConflictError(
            f"Shard {uri} already exists with different bytes ({info.size} bytes; this write "
            f"has {size}): another job wrote it"
        )
    return info.etag


def stream_sha256(uri: str, size: int, etag: str, storage_config: StorageConfig) -> str:
    """The sha256 hex of an object's bytes, streamed (size and etag checked)."""
    digest = hashlib.sha256()
    with open_stream(
        uri, size_bytes=size, etag=etag or None, storage_config=storage_config
    ) as stream:
        for chunk in stream:
            digest.update(chunk)
    return digest.hexdigest()


def copy_shard(
    shard: ManifestShard,
    destination_uri: str,
    *,
    data_format: DataManifestDataFormat,
    storage_config: StorageConfig | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> ManifestShard:
    """Copies one shard's bytes to ``destination_uri`` and returns it described there (the
    source's ``records``, the destination's size and etag).

    The source is streamed (size and etag checked, resumed after transient failures) into the
    saver's spool: memory up to 64 MiB, then a temporary file, so memory stays bounded whatever
    the shard's size. The destination is written create-only with the format's object
    attributes; an existing object with identical bytes is reused (a re-run copy is
    idempotent). ``on_bytes`` is called with the size of every chunk received.

    Raises:
        PublicationConflictError: the destination holds other bytes.
        ObjectDataError: the source's size disagrees with ``shard.size_bytes``.
        FileNotFoundError, PermissionError, ObjectChangedError, StorageRetryExhaustedError:
            from the store.
    """
    config = storage_config or StorageConfig()
    spool = Spool(limits().spill_bytes)
    try:
        source_etag = portable_etag(shard.uri, shard.etag) or None
        with open_stream(
            shard.uri, size_bytes=shard.size_bytes, etag=source_etag, storage_config=config
        ) as stream:
            for chunk in stream:
                spool.write(chunk)
                if on_bytes is not None:
                    on_bytes(len(chunk))
        spool.seal()
        size, etag = upload_spool(destination_uri, spool, data_format, config, create_only=True)
    finally:
        spool.close()
    return ManifestShard(
        uri=destination_uri,
        records=shard.records,
        size_bytes=size,
        etag=portable_etag(destination_uri, etag),
    )
