"""Shards found in the store (SPEC section 5): a completion descriptor or session record is
checked, with its data object, before its shard may be published, and the store scan that
finds every completed shard under a manifest.

A found shard is trusted only when its descriptor is exactly what a saver would write for it
(canonical bytes, format, split, stage, URI layout) and its data object is still the one
described: present, of the same size, with the same etag where both are known, else the same
sha256. Anything else is a PublicationConflictError, never a skipped shard, so a tampered
shard cannot slip into or silently out of a manifest.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

from syvain_training_data.errors import PublicationConflictError
from syvain_training_data.manifest import ManifestShard
from syvain_training_data.object_check import check_head
from syvain_training_data.publish.builder import Saved
from syvain_training_data.publish.descriptor import (
    check_canonical,
    conflict,
    loads_descriptor,
    parse_descriptor,
)
from syvain_training_data.publish.layout import DESCRIPTOR_SUFFIX, SESSION_RECORD_SUFFIX, Layout
from syvain_training_data.publish.upload import stream_sha256
from syvain_training_data.storage import StorageConfig, get_object, list_objects
from syvain_training_data.uris import check_shard_scheme, portable_etag

__all__ = ["UNSET", "ShardRecovery", "Unset"]

# Descriptors are small: the scan is bound by round trips, so they are read in parallel.
_SCAN_THREADS: Final = 16


class Unset:
    """The type of :data:`UNSET`: an argument not passed, where None is a value."""

    def __repr__(self) -> str:
        return "<unset>"


UNSET: Final = Unset()


@dataclass(frozen=True)
class ShardRecovery:
    """Checks the shards a saver finds under its manifest's layout."""

    layout: Layout
    storage_config: StorageConfig

    def verify_descriptor(
        self,
        data: bytes,
        descriptor_uri: str,
        shard_uri: str,
        *,
        split: str | None,
        stage: str | None | Unset,
        metadata: str | None | Unset,
        deterministic: bool = True,
    ) -> Saved:
        """Checks a descriptor (``split=None``/``stage=UNSET``: take them from it, then check the
        URI layout) and its data object; returns what it describes."""
        data_format = self.layout.data_format
        found = parse_descriptor(data, descriptor_uri, data_format)
        if split is not None and found.split != split:
            raise conflict(descriptor_uri, f"split is {found.split!r}, not {split!r}")
        if not isinstance(stage, Unset) and found.stage != stage:
            raise conflict(descriptor_uri, f"curriculum_stage is {found.stage!r}, not {stage!r}")
        if not isinstance(metadata, Unset) and found.metadata != metadata:
            raise conflict(descriptor_uri, "curriculum_metadata differs from the one passed")
        shard = found.shard
        if shard.uri != shard_uri:
            raise conflict(descriptor_uri, f"shard uri is {shard.uri!r}, expected {shard_uri!r}")
        check_shard_scheme(self.layout.manifest_uri, shard.uri)
        if split is None:
            try:
                placed = self.layout.places(shard.uri, found.split, found.stage, deterministic)
            except ValueError as error:
                raise conflict(descriptor_uri, str(error)) from None
            if not placed:
                raise conflict(
                    descriptor_uri,
                    f"shard uri {shard.uri!r} is not where split {found.split!r} stage "
                    f"{found.stage!r} shards go",
                )
        check_canonical(data, descriptor_uri, data_format, found)
        self.verify_data_object(shard, found.sha256, descriptor_uri)
        # A local etag recorded in a descriptor is neither enforced nor published (SPEC 4).
        shard = shard.model_copy(update={"etag": portable_etag(shard.uri, shard.etag)})
        return Saved(found.split, found.stage, found.metadata, shard, deterministic)

    def verify_data_object(self, shard: ManifestShard, digest: str, descriptor_uri: str) -> None:
        """PublicationConflictError unless the data object is the one the descriptor at
        ``descriptor_uri`` describes: its size, its etag where both are known, else its sha256
        ``digest``."""
        try:
            check = check_head(
                shard.uri, self.storage_config, size=shard.size_bytes, etag=shard.etag
            )
        except FileNotFoundError:
            raise conflict(descriptor_uri, f"its data object {shard.uri} does not exist") from None
        info, mismatch = check.info, check.mismatch
        if mismatch is not None and mismatch.field == "size":
            reason = f"its data object has {mismatch.found} bytes, not {mismatch.expected}"
            raise conflict(descriptor_uri, reason)
        if mismatch is not None:
            # Quoted or not, as another writer may have recorded it.
            reason = f"its data object has etag {mismatch.found!r}, not {mismatch.expected!r}"
            raise conflict(descriptor_uri, reason)
        if not check.etag_compared and digest != stream_sha256(
            shard.uri, info.size, info.etag, self.storage_config
        ):
            raise conflict(descriptor_uri, "its data object's sha256 differs")

    def scan(self) -> list[Saved]:
        """Every completed deterministic shard under the manifest and every shard the saver's
        session saved without shard_id, all verified."""
        objects = list_objects(
            self.layout.deterministic_base_uri, storage_config=self.storage_config
        )
        session_prefix = self.layout.session_prefix
        tasks: list[tuple[str, str, bool]] = []
        for info in objects:
            if info.uri.endswith(DESCRIPTOR_SUFFIX):
                tasks.append((info.uri, info.uri[: -len(DESCRIPTOR_SUFFIX)], True))
            elif info.uri.startswith(session_prefix) and info.uri.endswith(SESSION_RECORD_SUFFIX):
                tasks.append((info.uri, "", False))
        with ThreadPoolExecutor(max_workers=_SCAN_THREADS) as pool:
            return list(pool.map(self._verify_found, tasks))

    def _verify_found(self, task: tuple[str, str, bool]) -> Saved:
        uri, shard_uri, deterministic = task
        data = get_object(uri, storage_config=self.storage_config)
        if not deterministic:
            # The record is named after its shard; its URI is read from it, then checked.
            document = loads_descriptor(data, uri)
            described = document.get("shard") if isinstance(document, dict) else None
            shard_uri = described.get("uri", "") if isinstance(described, dict) else ""
            if shard_uri.rsplit("/", 1)[-1] + SESSION_RECORD_SUFFIX != uri.rsplit("/", 1)[1]:
                raise PublicationConflictError(f"Saved-shard record {uri} names another shard")
        return self.verify_descriptor(
            data,
            uri,
            str(shard_uri),
            split=None,
            stage=UNSET,
            metadata=UNSET,
            deterministic=deterministic,
        )
