"""The package's own exception types (the extension raises these by name).

Each derives from :class:`SyvainError` and from RuntimeError: they say that the data or the
store is wrong, not the caller's arguments (ValueError and TypeError say that), so ``except
RuntimeError`` catches them. Errors carry what they are about as attributes (``uri``,
``reason``, ``data_format``): callers never parse messages.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ObjectChangedError",
    "ObjectDataError",
    "PublicationConflictError",
    "RepresentationIntegrityError",
    "ShardDataError",
    "StorageError",
    "StorageRetryExhaustedError",
    "SyvainError",
]


class SyvainError(Exception):
    """Base of every exception this package defines. (Argument errors are the built-in
    ValueError and TypeError; missing objects FileNotFoundError; local files OSError.)"""


class StorageError(SyvainError, RuntimeError):
    """A storage operation failed in a way retrying cannot fix. ``uri`` names the object
    (None when no single object is concerned) and ``reason`` what went wrong."""

    def __init__(self, message: str, uri: str | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.uri = uri
        self.reason = message if reason is None else reason

    def __reduce__(self) -> tuple[Any, ...]:  # keeps the attributes across processes
        return (type(self), (str(self), self.uri, self.reason))


class StorageRetryExhaustedError(StorageError):
    """Transient failures spent the retry budget of SPEC section 4 without progress.

    The message names the operation, the URI, the offset and expected size (streams), the number
    of attempts and the last error.
    """


class ObjectChangedError(StorageError):
    """An immutable object changed while it was read: its etag no longer matches (If-Match
    precondition failed). The read fails closed; nothing is yielded from the new version."""


class ObjectDataError(StorageError):
    """An object's bytes disagree with what the caller declared (its size, or a file that
    changed while it was uploaded). Message: "{uri}: {reason}"."""


class ShardDataError(SyvainError, RuntimeError):
    """A shard's bytes are not what its format and manifest entry promise (SPEC section 3).

    Message: "Unreadable {data_format} shard {uri}: {reason}"; the three are attributes."""

    def __init__(
        self,
        message: str,
        data_format: str | None = None,
        uri: str | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.data_format = data_format
        self.uri = uri
        self.reason = message if reason is None else reason

    @classmethod
    def of(cls, data_format: str, uri: str, reason: object) -> ShardDataError:
        return cls(f"Unreadable {data_format} shard {uri}: {reason}", data_format, uri, str(reason))

    def __reduce__(self) -> tuple[Any, ...]:  # keeps the attributes across processes
        return (type(self), (str(self), self.data_format, self.uri, self.reason))


class PublicationConflictError(SyvainError, RuntimeError):
    """A publication would contradict what is already in the store: a shard, completion
    descriptor or manifest exists with other bytes, a descriptor fails its checks (keys, schema,
    digest, format, split, stage, URI, metadata, or its data object is missing or differs), or a
    registration contradicts an earlier one. Nothing is overwritten; the message names the
    object."""


class RepresentationIntegrityError(SyvainError, RuntimeError):
    """The OLMo 3 representation publication failed a custody or schema check of SPEC section 7:
    a manifest, index, artifact manifest, metadata table or tensor file that is missing, changed,
    differs from what the publication claims (size, etag, SHA-256, rows, roles), or breaks the
    publication's schema. A RuntimeError, like PublicationConflictError: the data is wrong, not
    the caller's arguments (those raise ValueError or TypeError). Nothing has been yielded when
    it is raised; the message names the object (URI) and what is wrong."""
