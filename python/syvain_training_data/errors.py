"""The package's own exception types (the extension raises these by name)."""

from __future__ import annotations

__all__ = ["ObjectChangedError", "StorageRetryExhaustedError"]


class StorageRetryExhaustedError(RuntimeError):
    """Transient failures spent the retry budget of SPEC section 4 without progress.

    The message names the operation, the URI, the offset and expected size (streams), the number
    of attempts and the last error.
    """


class ObjectChangedError(RuntimeError):
    """An immutable object changed while it was read: its etag no longer matches (If-Match
    precondition failed). The read fails closed; nothing is yielded from the new version."""
