"""Uploading a spooled shard with its format's object attributes (SPEC section 4), create-only
when it is deterministic, and copying a shard from one store to another through a spool."""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable
from typing import Final

from syvain_training_data.errors import ObjectDataError, PublicationConflictError, ShardDataError
from syvain_training_data.formats import shard_index
from syvain_training_data.formats.indexes import build_index
from syvain_training_data.formats.registry import FORMATS
from syvain_training_data.formats.shard_index import INDEX_SUFFIX
from syvain_training_data.manifest import DataManifestDataFormat, ManifestShard
from syvain_training_data.publish.spool import Spool, limits
from syvain_training_data.storage import (
    ObjectInfo,
    StorageConfig,
    delete_object,
    get_object,
    head_object,
    open_stream,
    put_file,
    put_object,
)
from syvain_training_data.uris import portable_etag

__all__ = [
    "OBJECT_ATTRIBUTES",
    "copy_shard",
    "create_or_match",
    "stream_sha256",
    "spool_index",
    "upload_spool",
    "write_index",
]

logger = logging.getLogger(__name__)

# SPEC section 4: content type and (content-format, compression) metadata per format.
OBJECT_ATTRIBUTES: Final[dict[str, tuple[str, dict[str, str]]]] = {
    name: (kind.content_type, dict(kind.attributes)) for name, kind in FORMATS.items()
}


def write_index(shard_uri: str, index: bytes | list[bytes], storage_config: StorageConfig) -> None:
    """Writes a shard's index (``formats.indexes``) beside it. An index is derived from the
    shard and names its version, so one already there (an earlier release's, or one left by a
    shard since rewritten) is replaced rather than kept or refused."""
    put_object(
        shard_uri + INDEX_SUFFIX,
        index,
        storage_config=storage_config,
        content_type=shard_index.CONTENT_TYPE,
    )


def spool_index(
    data_format: str, uri: str, spool: Spool, records: int, size: int, etag: str
) -> list[bytes] | None:
    """The index of the shard uploaded from ``spool`` (its bytes read again), or None for a
    format without one."""
    if not FORMATS[data_format].record_index:
        return None
    return build_index(data_format, uri, spool.read_chunks(), records, size, etag)


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
    size, etag, _ = _upload(uri, spool, data_format, storage_config, create_only=create_only)
    return size, etag


def _upload(
    uri: str,
    spool: Spool,
    data_format: str,
    storage_config: StorageConfig,
    *,
    create_only: bool,
) -> tuple[int, str, bool]:
    """:func:`upload_spool`, also saying whether this call wrote the object (False: an
    identical existing object was reused)."""
    content_type, attributes = OBJECT_ATTRIBUTES[data_format]
    put: Callable[..., ObjectInfo]
    if spool.path is not None:
        rules = limits()
        put = functools.partial(
            put_file,
            uri,
            spool.path,
            single_put_max=rules.deterministic_single_put_bytes,
            multipart_threshold=rules.multipart_threshold,
            part_size=rules.part_size,
        )
    else:
        put = functools.partial(put_object, uri, spool.chunks)
    written: list[ObjectInfo] = []
    existing: list[ObjectInfo] = []

    def write() -> None:
        written.append(
            put(
                storage_config=storage_config,
                content_type=content_type,
                metadata=attributes,
                create_only=create_only,
            )
        )

    def holds_our_bytes() -> bool:
        info = head_object(uri, storage_config=storage_config)
        existing.append(info)
        return info.size == spool.size and (
            stream_sha256(uri, info.size, info.etag, storage_config) == spool.sha256()
        )

    def conflict() -> PublicationConflictError:
        return PublicationConflictError(
            f"Shard {uri} already exists with different bytes ({existing[0].size} bytes; this "
            f"write has {spool.size}): another job wrote it"
        )

    if create_or_match(uri, write, storage_config, matches=holds_our_bytes, conflict=conflict):
        return written[0].size, written[0].etag, True
    logger.info("Reusing the identical existing object %s", uri)
    return spool.size, existing[0].etag, False


def stream_sha256(uri: str, size: int, etag: str, storage_config: StorageConfig) -> str:
    """The sha256 hex of an object's bytes, streamed (size and etag checked)."""
    digest = hashlib.sha256()
    with open_stream(
        uri, size_bytes=size, etag=etag or None, storage_config=storage_config
    ) as stream:
        for chunk in stream:
            digest.update(chunk)
    return digest.hexdigest()


# A completion descriptor larger than this is not read for its digest (they are ~500 bytes).
_DESCRIPTOR_READ_MAX: Final = 1024 * 1024


def copy_shard(
    shard: ManifestShard,
    destination_uri: str,
    *,
    data_format: DataManifestDataFormat,
    storage_config: StorageConfig | None = None,
    on_bytes: Callable[[int], None] | None = None,
    on_records: Callable[[int], None] | None = None,
) -> ManifestShard:
    """Copies one shard's bytes to ``destination_uri`` and returns it described there (the
    source's ``records``, the destination's size and etag).

    Verified before anything is written, so that a failed copy leaves no object behind that a
    later run could take for a good copy:

    1. The source is streamed (size checked; etag checked where the manifest records one for
       an s3:// shard; resumed after transient failures) into a temporary file (in the system
       temp directory, removed afterwards), hashed as it arrives: disk, not memory, whatever
       the shard's size.
    2. Where the source has a completion descriptor (``{uri}.metadata.json``, SPEC section 5)
       describing this shard (same URI, records and size), the bytes' sha256 must be its.
    3. The file is decoded: it must hold exactly ``shard.records`` records of ``data_format``.
    4. Only then is the destination written, create-only with the format's object
       attributes; an existing object with identical bytes is reused (a re-run copy is
       idempotent), other bytes are a conflict.
    5. The destination is read back: its size, and its sha256 must be the verified bytes'.
       If that fails (or anything is interrupted) after this call wrote the object, the
       object is deleted before the error is raised.

    ``on_bytes`` is called with the size of every chunk received, ``on_records`` with counts
    of records decoded.

    Raises:
        ShardDataError: the source's bytes do not decode to ``shard.records`` records, or do
            not match its descriptor's sha256 (the message names the source shard).
        PublicationConflictError: the destination holds other bytes.
        ObjectDataError: the source's size disagrees with ``shard.size_bytes``.
        RuntimeError: the destination does not hold the bytes written (deleted again).
        FileNotFoundError, PermissionError, ObjectChangedError, StorageRetryExhaustedError:
            from the store.
    """
    config = storage_config or StorageConfig()
    spool = Spool(0)  # always a file: decoded in place before the upload
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
        _check_descriptor_digest(shard, data_format, spool.sha256(), config)
        _check_records(shard, data_format, spool, on_records)
        size, etag, created = _upload(destination_uri, spool, data_format, config, create_only=True)
        try:
            _check_destination(destination_uri, spool, size, etag, config)
        except BaseException:
            if created:
                _delete_quietly(destination_uri, config)
            raise
        # The copy's own index, from the verified bytes (the source's is not trusted).
        index = spool_index(data_format, destination_uri, spool, shard.records, size, etag)
        if index is not None:
            write_index(destination_uri, index, config)
    finally:
        spool.close()
    return ManifestShard(
        uri=destination_uri,
        records=shard.records,
        size_bytes=size,
        etag=portable_etag(destination_uri, etag),
    )


def create_or_match(
    uri: str,
    write: bytes | Callable[[], object],
    storage_config: StorageConfig,
    *,
    conflict: str | Callable[[], Exception],
    matches: Callable[[], bool] | None = None,
) -> bool:
    """The create-only rule of publication: create ``uri``, else accept only what is there.

    ``write`` is the JSON bytes to PUT create-only, or a callable that uploads create-only
    itself. Where an object is already at ``uri``, it is accepted when it holds what this call
    would write: by default the same bytes, read back (``write`` must then be bytes);
    ``matches`` replaces that test (it may raise its own error). Otherwise ``conflict()`` is
    raised; a str names the object instead: PublicationConflictError "{conflict} {uri} already
    exists with different bytes".

    Returns True when this call wrote the object, False when an equal one was already there.
    """
    try:
        if isinstance(write, bytes):
            put_object(
                uri,
                write,
                storage_config=storage_config,
                content_type="application/json",
                create_only=True,
            )
        else:
            write()
        return True
    except FileExistsError:
        if matches is None:
            matches = functools.partial(_holds, uri, write, storage_config)
        if matches():
            return False
        if isinstance(conflict, str):
            raise PublicationConflictError(
                f"{conflict} {uri} already exists with different bytes"
            ) from None
        raise conflict() from None


def _holds(uri: str, data: object, storage_config: StorageConfig) -> bool:
    return get_object(uri, storage_config=storage_config) == data


def _check_descriptor_digest(
    shard: ManifestShard, data_format: str, sha256: str, config: StorageConfig
) -> None:
    """ShardDataError when the shard's completion descriptor, if it has one that describes
    exactly this shard, records another sha256. A missing, oversized or invalid descriptor, or
    one describing another object, is not a digest we know: it is ignored."""
    from syvain_training_data.publish.descriptor import parse_descriptor
    from syvain_training_data.publish.layout import DESCRIPTOR_SUFFIX

    descriptor_uri = shard.uri + DESCRIPTOR_SUFFIX
    try:
        info = head_object(descriptor_uri, storage_config=config)
        if info.size > _DESCRIPTOR_READ_MAX:
            return
        data = get_object(descriptor_uri, storage_config=config)
        described = parse_descriptor(data, descriptor_uri, data_format)
    except (FileNotFoundError, PublicationConflictError):
        return
    found = described.shard
    if (found.uri, found.records, found.size_bytes) != (
        shard.uri,
        shard.records,
        shard.size_bytes,
    ):
        return
    if described.sha256 != sha256:
        raise ShardDataError.of(
            data_format,
            shard.uri,
            f"its bytes' sha256 is {sha256}, but its completion descriptor "
            f"{descriptor_uri} records {described.sha256}",
        )


def _check_records(
    shard: ManifestShard,
    data_format: DataManifestDataFormat,
    spool: Spool,
    on_records: Callable[[int], None] | None,
) -> None:
    """Decodes the spooled file: exactly ``shard.records`` records of the format, or a
    ShardDataError naming the source shard."""
    from syvain_training_data.shard import iter_shard

    assert spool.path is not None
    local_uri = "file://" + spool.path
    local = ManifestShard(uri=local_uri, records=shard.records, size_bytes=spool.size)
    counted = 0
    try:
        for _ in iter_shard(data_format, local):
            counted += 1
            if on_records is not None and counted % 1024 == 0:
                on_records(1024)
    except ShardDataError as error:
        raise ShardDataError(
            str(error).replace(local_uri, shard.uri),
            data_format,
            shard.uri,
            None if error.reason is None else error.reason.replace(local_uri, shard.uri),
        ) from None
    if on_records is not None:
        on_records(counted % 1024)


def _check_destination(uri: str, spool: Spool, size: int, etag: str, config: StorageConfig) -> None:
    """RuntimeError unless the object at ``uri`` holds exactly the spooled bytes."""
    info = head_object(uri, storage_config=config)
    if size != spool.size or info.size != spool.size:
        raise ObjectDataError(f"{uri}: the copy has {info.size:,} bytes, the source {spool.size:,}")
    if stream_sha256(uri, info.size, portable_etag(uri, info.etag), config) != spool.sha256():
        raise ObjectDataError(f"{uri}: the copy's sha256 differs from the source bytes'")


def _delete_quietly(uri: str, config: StorageConfig) -> None:
    """Deletes what a failed copy wrote; a failure to delete is logged, not raised over the
    copy's own error."""
    try:
        delete_object(uri, storage_config=config)
        logger.warning("Deleted %s: the copy failed after it was written", uri)
    except Exception as error:  # the copy's error is the one to raise
        logger.error("Could not delete %s after a failed copy: %s", uri, error)
