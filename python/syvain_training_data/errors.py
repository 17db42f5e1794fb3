"""The package's own exception types (the extension raises these by name)."""

from __future__ import annotations

__all__ = [
    "ObjectChangedError",
    "PublicationConflictError",
    "RepresentationIntegrityError",
    "StorageRetryExhaustedError",
]


class StorageRetryExhaustedError(RuntimeError):
    """Transient failures spent the retry budget of SPEC section 4 without progress.

    The message names the operation, the URI, the offset and expected size (streams), the number
    of attempts and the last error.
    """


class ObjectChangedError(RuntimeError):
    """An immutable object changed while it was read: its etag no longer matches (If-Match
    precondition failed). The read fails closed; nothing is yielded from the new version."""


class PublicationConflictError(RuntimeError):
    """A publication would contradict what is already in the store: a shard, completion
    descriptor or manifest exists with other bytes, a descriptor fails its checks (keys, schema,
    digest, format, split, stage, URI, metadata, or its data object is missing or differs), or a
    registration contradicts an earlier one. Nothing is overwritten; the message names the
    object."""


class RepresentationIntegrityError(RuntimeError):
    """The OLMo 3 representation publication failed a custody or schema check of SPEC section 7:
    a manifest, index, artifact manifest, metadata table or tensor file that is missing, changed,
    differs from what the publication claims (size, etag, SHA-256, rows, roles), or breaks the
    publication's schema. A RuntimeError, like PublicationConflictError: the data is wrong, not
    the caller's arguments (those raise ValueError or TypeError). Nothing has been yielded when
    it is raised; the message names the object (URI) and what is wrong."""
