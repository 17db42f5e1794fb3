"""`DatasetSaver`: idempotent publication of a dataset from many processes (SPEC section 5).

A saver writes shards next to a manifest and, last, the manifest itself::

    saver = client.dataset_saver("s3://bucket/datasets/x/data-manifest.json")
    saver.save("train", None, records, shard_id="train-00000")   # in any process
    saver.commit_manifest()                                       # once, in the parent

The layout of its objects is in :mod:`syvain_training_data.publish.layout`.

Decisions taken where SPEC is silent:

- **Names keep their whitespace.** Stripping applies to URI segments only; the manifest and the
  descriptor hold the split and stage names as given. Segments that encode to ``.`` or ``..``
  are rejected (they would name another directory).
- **Shards from other processes.** A deterministic shard (with ``shard_id``) is found by
  ``commit_manifest`` from its completion descriptor, listed under the ``by-manifest`` prefix,
  whichever process or machine saved it, including earlier runs of the same job. A shard
  without ``shard_id`` is recorded, after its data object, at
  ``{base}/by-manifest/{sha}/saver-sessions/{session}/part-{uuid}.saved.json`` (descriptor
  bytes), where ``session`` is a uuid4 hex drawn when the saver is created and shared by its
  pickled copies: a later saver instance has another session and never publishes them.
- **Found shards are verified.** Every descriptor found in the store passes the checks of
  ``recover`` (data object present, size, etag or sha256); a tampered one anywhere under the
  manifest fails the commit with PublicationConflictError rather than being skipped.
- **Local etags.** A ``file://`` object's etag (inode and mtime) does not survive cp, rsync or
  a restore, so manifests and descriptors record ``""`` for it, and one recorded there anyway
  is not enforced: its size and sha256 guard it (SPEC section 4).
- **Expected shards.** ``expect_shards(split, stage, shard_ids)`` states the complete set of
  deterministic shards of one split and stage; the commit then refuses (ValueError naming them)
  when any is missing or when another deterministic shard was found there.
- **Descriptors are canonical.** A descriptor whose bytes are not exactly the canonical bytes
  of its own content is a PublicationConflictError (SPEC fixes those bytes).
- **Uploads.** Encoded chunks are kept in memory up to ``spill_bytes`` (64 MiB), then the shard
  continues in a temporary file (``syvain-shard-*`` in the system temp directory), removed
  however ``save`` ends (a SIGKILL can leave one behind). A shard in memory is uploaded from its
  chunks without joining them; a file-backed one by the native ``put_file``: one PUT (create-only
  for deterministic shards), or, above 64 MiB for shards without ``shard_id``, a streamed
  multipart upload. Deterministic parquet and msgpack.zstf shards must be smaller than 5 GiB so
  one create-only PUT can write them. **Limitation:** a deterministic jsonl.gz shard of 5 GiB or
  more goes up as a multipart upload after a HEAD that finds no object (the store client has no
  create-only multipart completion); two writers racing on the same shard inside that window
  both write. Identical bytes are harmless; differing bytes are caught by the descriptor and
  etag checks (PublicationConflictError), not prevented.
- The saver is safe to use from several threads; pickled copies share nothing but the store.
"""

from __future__ import annotations

import itertools
import json
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from syvain_training_data.argument_checks import records_iterable
from syvain_training_data.errors import PublicationConflictError
from syvain_training_data.formats import FORMATS, ShardFormat, check_data_format
from syvain_training_data.formats.shard_index import FrameOffsets, version_tag
from syvain_training_data.manifest import (
    DataManifest,
    DataManifestDataFormat,
    ManifestShard,
    canonical_manifest_bytes,
    parse_manifest,
    read_manifest_bytes,
)
from syvain_training_data.publish.builder import Saved, build_manifest, check_expected, uris_of
from syvain_training_data.publish.descriptor import descriptor_bytes, validate_metadata
from syvain_training_data.publish.layout import (
    DESCRIPTOR_SUFFIX,
    Layout,
    encode_segment,
    manifest_key,
)
from syvain_training_data.publish.recovery import UNSET, ShardRecovery, Unset
from syvain_training_data.publish.spool import Spool, encode_native, encode_parquet, limits
from syvain_training_data.publish.upload import (
    create_or_match,
    spool_index,
    upload_spool,
    write_index,
)
from syvain_training_data.storage import StorageConfig, check_storage_config, get_object, put_object
from syvain_training_data.uris import portable_etag

__all__ = ["DatasetSaver"]

# Formats whose deterministic shards must fit one create-only PUT (SPEC section 5).


def _format_bytes(size: int) -> str:
    if size % (1024**3) == 0:
        return f"{size // 1024**3} GiB"
    return f"{size} bytes"


class DatasetSaver:
    """Writes the shards of one dataset and, last, its manifest (SPEC section 5).

    Build one with :meth:`SyvainTrainingData.dataset_saver`. It is picklable: copies in worker
    processes (ProcessPoolExecutor, Ray tasks, other machines) save shards, and the parent's
    :meth:`commit_manifest` publishes every deterministic shard any of them completed, plus the
    shards without ``shard_id`` saved by this saver or its copies.
    """

    def __init__(
        self,
        manifest_uri: str,
        *,
        data_format: DataManifestDataFormat = "jsonl.gz",
        storage_config: StorageConfig | None = None,
    ) -> None:
        if not isinstance(manifest_uri, str) or manifest_uri.endswith("/"):
            raise ValueError(f"manifest_uri must be an object key, not a prefix: {manifest_uri!r}")
        check_data_format(data_format)
        manifest_key(manifest_uri)  # a URI of another kind fails now
        self.manifest_uri = manifest_uri
        self.data_format: DataManifestDataFormat = data_format
        self.storage_config = storage_config or StorageConfig()
        self.layout = Layout(manifest_uri, data_format, uuid.uuid4().hex)
        self.shard_base_uri = self.layout.shard_base_uri
        self.deterministic_base_uri = self.layout.deterministic_base_uri
        self.session_id = self.layout.session_id
        self._saved: dict[str, Saved] = {}
        self._curricula: dict[tuple[str, str], tuple[tuple[str, ...], str | None]] = {}
        self._split_orders: dict[str, tuple[str, ...]] = {}
        self._expected: dict[tuple[str, str | None], frozenset[str]] = {}
        self._lock = threading.RLock()
        check_storage_config(self.storage_config)  # a bad endpoint fails now

    # -- pickling: everything but the lock ---------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    @property
    def shard_format(self) -> ShardFormat:
        """The descriptor of this saver's data format."""
        return FORMATS[self.data_format]

    def __repr__(self) -> str:
        return f"DatasetSaver({self.manifest_uri!r}, data_format={self.data_format!r})"

    # -- layout ------------------------------------------------------------------------------

    def shard_uri(self, split: str, curriculum_stage: str | None, shard_id: str | None) -> str:
        """The URI a shard gets (SPEC section 5); ``shard_id=None`` draws a random id."""
        return self.layout.shard_uri(split, curriculum_stage, shard_id)

    # -- saving ------------------------------------------------------------------------------

    def save(
        self,
        split: str,
        curriculum_stage: str | None,
        records: Iterable[Mapping[str, Any]],
        *,
        curriculum_metadata: Mapping[str, Any] | None = None,
        shard_id: str | None = None,
    ) -> ManifestShard:
        """Encodes ``records`` into one shard, uploads it, and registers it for the manifest.

        With ``shard_id`` the shard is deterministic: a completed one (found by :meth:`recover`)
        is returned without consuming ``records``; otherwise it is uploaded create-only and gets
        its completion descriptor.

        Raises:
            ValueError: empty split, stage or shard_id; metadata without a stage; metadata that
                is not a JSON object; ``"Cannot save an empty record shard"``; a deterministic
                parquet or msgpack.zstf shard of 5 GiB or more; a record the format cannot
                encode.
            PublicationConflictError: an existing data object or descriptor with other bytes,
                or the same URI registered with other content.
            FileNotFoundError, PermissionError, StorageRetryExhaustedError: from the store.
        """
        encode_segment(split, "split")
        if curriculum_stage is not None:
            encode_segment(curriculum_stage, "curriculum_stage")
        if curriculum_metadata is not None and curriculum_stage is None:
            raise ValueError("curriculum_metadata requires a curriculum_stage")
        metadata = validate_metadata(curriculum_metadata)
        records = records_iterable(records)
        if shard_id is not None:
            found = self.recover(
                split, curriculum_stage, shard_id=shard_id, curriculum_metadata=curriculum_metadata
            )
            if found is not None:
                return found
        uri = self.shard_uri(split, curriculum_stage, shard_id)
        iterator = iter(records)
        first = next(iterator, UNSET)
        if isinstance(first, Unset):
            raise ValueError("Cannot save an empty record shard")
        spool = Spool(limits().spill_bytes)
        # msgpack.zstf frames are noted as they are encoded; other indexes read the spool again.
        frames = FrameOffsets() if self.shard_format.index == "frame_offsets" else None
        try:
            count = self._encode(itertools.chain((first,), iterator), spool, shard_id, frames)
            shard, etag = self._upload(uri, spool, count, deterministic=shard_id is not None)
            version = version_tag(uri, etag)
            index = (
                [frames.index(shard.size_bytes, version).to_bytes()]
                if frames is not None
                else spool_index(self.data_format, uri, spool, count, shard.size_bytes, etag)
            )
            descriptor = descriptor_bytes(
                shard=shard,
                data_format=self.data_format,
                split=split,
                curriculum_stage=curriculum_stage,
                curriculum_metadata=None if metadata is None else json.loads(metadata),
                sha256=spool.sha256(),
            )
        finally:
            spool.close()
        if index is not None:  # before the descriptor: a completed shard has its index
            write_index(uri, index, self.storage_config)
        if shard_id is not None:
            self._create_descriptor(uri + DESCRIPTOR_SUFFIX, descriptor)
        else:
            put_object(
                self.layout.session_record_uri(uri),
                descriptor,
                storage_config=self.storage_config,
                content_type="application/json",
                create_only=True,
            )
        self._register(Saved(split, curriculum_stage, metadata, shard, shard_id is not None))
        return shard

    def _encode(
        self,
        records: Iterator[Mapping[str, Any]],
        spool: Spool,
        shard_id: str | None,
        frames: FrameOffsets | None,
    ) -> int:
        limit = limits().deterministic_single_put_bytes
        single_put = shard_id is not None and self.shard_format.single_put

        def check(size: int) -> None:
            if single_put and size >= limit:
                raise ValueError(
                    f"Deterministic {self.data_format} shard {shard_id!r} reached {size} bytes: "
                    f"deterministic parquet and msgpack.zstf shards must be smaller than "
                    f"{_format_bytes(limit)} (one create-only PUT); spread the records over more "
                    "shard IDs"
                )

        if self.shard_format.codec == "arrow":
            count = encode_parquet(records, spool)
            check(spool.size)
        else:
            count = encode_native(self.data_format, records, spool, check, frames)
        spool.seal()
        return count

    def _upload(
        self, uri: str, spool: Spool, records: int, *, deterministic: bool
    ) -> tuple[ManifestShard, str]:
        """The shard as the manifest describes it, and its etag as the store gave it."""
        size, etag = upload_spool(
            uri, spool, self.data_format, self.storage_config, create_only=deterministic
        )
        shard = ManifestShard(
            uri=uri, records=records, size_bytes=size, etag=portable_etag(uri, etag)
        )
        return shard, etag

    def _create_descriptor(self, uri: str, data: bytes) -> None:
        create_or_match(uri, data, self.storage_config, conflict="Completion descriptor")

    # -- recovery ----------------------------------------------------------------------------

    def recover(
        self,
        split: str,
        curriculum_stage: str | None,
        *,
        shard_id: str,
        curriculum_metadata: Mapping[str, Any] | None | Unset = UNSET,
    ) -> ManifestShard | None:
        """The completed deterministic shard ``shard_id``, registered for the manifest, or None
        when it has no completion descriptor.

        Raises:
            PublicationConflictError: the descriptor is not exactly what this saver would write
                (keys, schema, digest, format, split, stage, URI and, when passed, metadata), or
                its data object is missing or differs (size; etag where both are known, else
                sha256).
            ValueError: an empty split, stage or shard_id, or metadata that is not an object.
        """
        expected_metadata: str | None | Unset = UNSET
        if not isinstance(curriculum_metadata, Unset):
            expected_metadata = validate_metadata(curriculum_metadata)
        uri = self.shard_uri(split, curriculum_stage, shard_id)
        descriptor_uri = uri + DESCRIPTOR_SUFFIX
        try:
            data = get_object(descriptor_uri, storage_config=self.storage_config)
        except FileNotFoundError:
            return None
        saved = self._recovery.verify_descriptor(
            data,
            descriptor_uri,
            uri,
            split=split,
            stage=curriculum_stage,
            metadata=expected_metadata,
        )
        self._register(saved)
        return saved.shard

    # -- shards found in the store -----------------------------------------------------------

    @property
    def _recovery(self) -> ShardRecovery:
        return ShardRecovery(self.layout, self.storage_config)

    def _scan_store(self) -> None:
        """Registers every completed deterministic shard under the manifest and every shard
        this saver's session saved without shard_id (all verified)."""
        for saved in self._recovery.scan():
            self._register(saved)

    def _register(self, saved: Saved) -> None:
        with self._lock:
            existing = self._saved.get(saved.shard.uri)
            if existing is not None and existing != saved:
                raise PublicationConflictError(
                    f"Shard {saved.shard.uri} is registered twice with different content"
                )
            self._saved[saved.shard.uri] = saved

    def _known(self, split: str, uris: Sequence[str]) -> dict[str, Saved]:
        """The saved shards of ``split``, from the store too when some URI is not known here."""
        with self._lock:
            missing = [uri for uri in uris if uri not in self._saved]
        if missing:
            self._scan_store()
        with self._lock:
            in_split = {uri: s for uri, s in self._saved.items() if s.split == split}
        unknown = [uri for uri in uris if uri not in in_split]
        if unknown:
            raise ValueError(
                f"Shards not saved or recovered in split {split!r}: {', '.join(unknown)}"
            )
        return in_split

    # -- ordering ----------------------------------------------------------------------------

    def register_curriculum(
        self,
        split: str,
        curriculum_stage: str,
        shards: Sequence[ManifestShard | str],
        *,
        curriculum_metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Names the ordered shards of a curriculum stage (shards or their URIs), all already
        saved or recovered in ``split``.

        Raises:
            ValueError: empty names or selection, a repeated shard, a shard not saved in the
                split, a selection that contradicts the stage inferred from saves, metadata that
                is not an object or that differs from the saves'.
            PublicationConflictError: a different registration of the same stage exists.
        """
        encode_segment(split, "split")
        encode_segment(curriculum_stage, "curriculum_stage")
        uris = uris_of(shards, f"curriculum stage {curriculum_stage!r}")
        metadata = validate_metadata(curriculum_metadata)
        in_split = self._known(split, uris)
        inferred = {uri for uri, s in in_split.items() if s.stage == curriculum_stage}
        if inferred and inferred != set(uris):
            raise ValueError(
                f"register_curriculum for stage {curriculum_stage!r} of split {split!r} "
                f"contradicts the shards saved with that stage ({len(inferred)} saved, "
                f"{len(uris)} registered)"
            )
        saved_values = {s.metadata for uri, s in in_split.items() if s.stage == curriculum_stage}
        if metadata is not None and saved_values - {None} and saved_values != {metadata}:
            raise ValueError(f"Inconsistent curriculum metadata for stage {curriculum_stage!r}")
        registration = (tuple(uris), metadata)
        with self._lock:
            existing = self._curricula.get((split, curriculum_stage))
            if existing is not None and existing != registration:
                raise PublicationConflictError(
                    f"Curriculum stage {curriculum_stage!r} of split {split!r} is already "
                    "registered with other shards or metadata"
                )
            self._curricula[(split, curriculum_stage)] = registration

    def register_split_order(self, split: str, shards: Sequence[ManifestShard | str]) -> None:
        """Orders the shards of ``split``: every saved shard of the split exactly once.

        Raises:
            ValueError: a repeated, unknown or missing shard.
            PublicationConflictError: a different order of the split is already registered.
        """
        encode_segment(split, "split")
        uris = uris_of(shards, f"split {split!r}")
        in_split = self._known(split, uris)
        left_out = sorted(set(in_split) - set(uris))
        if left_out:
            raise ValueError(
                f"register_split_order for split {split!r} leaves out saved shards: "
                f"{', '.join(left_out)}"
            )
        with self._lock:
            existing = self._split_orders.get(split)
            if existing is not None and existing != tuple(uris):
                raise PublicationConflictError(f"Split {split!r} already has another shard order")
            self._split_orders[split] = tuple(uris)

    def expect_shards(
        self, split: str, curriculum_stage: str | None, shard_ids: Iterable[str]
    ) -> None:
        """States the complete set of deterministic shard IDs of ``split`` and stage: the commit
        refuses, naming them, when any is missing or another was saved there.

        Raises ValueError for empty names or IDs, PublicationConflictError when another set was
        stated for the same split and stage."""
        encode_segment(split, "split")
        if curriculum_stage is not None:
            encode_segment(curriculum_stage, "curriculum_stage")
        ids = frozenset(shard_ids)
        for shard_id in ids:
            encode_segment(shard_id, "shard_id")
        key = (split, curriculum_stage)
        with self._lock:
            existing = self._expected.get(key)
            if existing is not None and existing != ids:
                raise PublicationConflictError(
                    f"Other shard IDs are already expected for split {split!r} stage "
                    f"{curriculum_stage!r}"
                )
            self._expected[key] = ids

    # -- the manifest ------------------------------------------------------------------------

    def build_manifest(self) -> DataManifest:
        """The manifest of every registered shard and every completed one found in the store.

        Raises:
            ValueError: no saved shards (``"Cannot commit a manifest with no saved shards"``);
                ``"Partial curriculum metadata for stage 'x'"``; ``"Inconsistent curriculum
                metadata for stage 'x'"``; expected shards missing; an order that no longer
                names every shard.
            PublicationConflictError: a tampered descriptor or data object; a URI registered
                twice with different content.
        """
        self._scan_store()
        with self._lock:
            saved = dict(self._saved)
            curricula = dict(self._curricula)
            orders = dict(self._split_orders)
            expected = dict(self._expected)
        if saved:
            check_expected(saved, expected, self.shard_uri)
        return build_manifest(self.data_format, saved, curricula, orders)

    def commit_manifest(self) -> DataManifest:
        """Writes the manifest create-only, last: the publication marker.

        An existing manifest equal to what would be written is returned (idempotent).

        Raises:
            PublicationConflictError: a different or invalid manifest already exists (and the
                conflicts of :meth:`build_manifest`).
            ValueError: see :meth:`build_manifest`.
        """
        manifest = self.build_manifest()
        data = canonical_manifest_bytes(manifest)
        published: list[DataManifest] = []

        def invalid() -> PublicationConflictError:
            return PublicationConflictError(
                f"An invalid manifest already exists at {self.manifest_uri}"
            )

        def same_manifest() -> bool:
            """Equal bytes, or bytes another writer spelled differently for the same manifest."""
            try:
                existing = read_manifest_bytes(
                    self.manifest_uri, storage_config=self.storage_config
                )
            except ValueError as error:  # over the manifest size limit
                raise invalid() from error
            if existing == data:
                return True
            try:
                published.append(parse_manifest(existing, self.manifest_uri))
            except ValueError as error:
                raise invalid() from error
            return published[0] == manifest

        create_or_match(
            self.manifest_uri,
            data,
            self.storage_config,
            matches=same_manifest,
            conflict=lambda: PublicationConflictError(
                f"A different manifest is already published at {self.manifest_uri}"
            ),
        )
        return published[0] if published else manifest
