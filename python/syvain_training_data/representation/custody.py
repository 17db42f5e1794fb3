"""Custody of every object the representation loader reads (SPEC section 7).

Each object is checked by HEAD (its size against the claim, its etag against the claim where
both are known), then streamed by the native downloader into the loader's private temporary
directory with If-Match on the etag, the size checked and SHA-256 computed while streaming
(in Rust, off the GIL); the digest must equal the claim. A failed download leaves no file.

Store errors are translated where they mean the publication is not what it claims: a missing
object the publication claims, an object that changed while it was read (etag precondition),
or a size mismatch become :class:`RepresentationIntegrityError`. Errors that say nothing about
the data keep their types: PermissionError, StorageRetryExhaustedError, OSError for the local
disk, KeyboardInterrupt.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, NoReturn, Self

from syvain_training_data.errors import (
    ObjectChangedError,
    ObjectDataError,
    RepresentationIntegrityError,
    ShardDataError,
)
from syvain_training_data.object_check import check_head
from syvain_training_data.storage import StorageConfig, download_object

__all__ = [
    "Claim",
    "Prefetcher",
    "Workspace",
    "custody_errors",
    "fetch",
    "integrity_error",
]

TEMP_PREFIX: Final = "syvain-representation-"
#: Objects the prefetcher downloads ahead of their use (the one in progress included).
PREFETCH_OBJECTS: Final = 3
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def integrity_error(uri: str, message: str) -> NoReturn:
    """Raises RepresentationIntegrityError("{uri}: {message}")."""
    raise RepresentationIntegrityError(f"{uri}: {message}")


@dataclass(frozen=True)
class Claim:
    """An object the publication claims: URI, size in bytes and lowercase hex SHA-256."""

    uri: str
    size: int
    sha256: str


class _ClosedOnExit:
    """``with`` support for an object whose :meth:`close` releases all it holds."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Workspace(_ClosedOnExit):
    """A private temporary directory (mode 0700, in ``TMPDIR``) removed by :meth:`close`,
    whatever happened; each fetched object gets its own new file in it."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
        self._count = 0
        self._count_lock = threading.Lock()  # fetches name their files from two threads

    def new_path(self, uri: str) -> Path:
        with self._count_lock:
            self._count += 1
            number = self._count
        name = _UNSAFE_NAME.sub("_", uri.rsplit("/", 1)[-1])[-80:]
        return self.path / f"{number:06d}-{name}"

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


@contextlib.contextmanager
def custody_errors(uri: str, *, missing_is_integrity: bool = True) -> Iterator[None]:
    """Translates store errors about ``uri`` that mean the publication is not what it claims
    into RepresentationIntegrityError (chained); other errors pass through unchanged."""
    try:
        yield
    except FileNotFoundError as error:
        if not missing_is_integrity:
            raise
        raise RepresentationIntegrityError(
            f"{uri}: the publication claims this object but it does not exist"
        ) from error
    except ObjectChangedError as error:
        raise RepresentationIntegrityError(
            f"{uri}: the object changed while it was read ({error})"
        ) from error
    except (ObjectDataError, ShardDataError) as error:
        # The stream's and the shard readers' data errors (size mismatch, unreadable shard,
        # wrong record count); other store failures keep their types.
        message = str(error) if error.uri == uri else f"{uri}: {error}"
        raise RepresentationIntegrityError(message) from error


def fetch(
    uri: str,
    workspace: Workspace,
    *,
    storage_config: StorageConfig,
    size: int | None = None,
    sha256: str | None = None,
    etag: str | None = None,
    what: str = "object",
    missing_is_integrity: bool = True,
    cancel: threading.Event | None = None,
) -> Path:
    """Downloads ``uri`` into a new file of ``workspace`` under custody and returns its path.

    ``size``, ``sha256`` and ``etag`` are the publication's claims (None: no claim; the HEAD's
    size and etag are then what the stream is pinned to). ``what`` names the object in messages.
    Setting ``cancel`` stops the download (InterruptedError), from any thread.

    Raises:
        RepresentationIntegrityError: HEAD size or etag differs from the claim, the streamed
            bytes differ in size or SHA-256, the object is missing (with
            ``missing_is_integrity``) or changed while it was read.
        FileNotFoundError: the object is missing and ``missing_is_integrity`` is false.
        PermissionError, StorageRetryExhaustedError, OSError (InterruptedError when
            cancelled), KeyboardInterrupt: unchanged.
    """
    with custody_errors(uri, missing_is_integrity=missing_is_integrity):
        check = check_head(uri, storage_config, size=size, etag=etag)
        info, mismatch = check.info, check.mismatch
        if mismatch is not None and mismatch.field == "size":
            integrity_error(uri, f"the {what} has {info.size} bytes but {size} are claimed")
        if mismatch is not None:
            integrity_error(
                uri, f"the {what} has etag {info.etag} but etag {etag} is claimed (replaced?)"
            )
        path = workspace.new_path(uri)
        received, digest = download_object(
            uri,
            path,
            size_bytes=info.size,
            etag=info.etag or etag or None,
            cancel=cancel,
            storage_config=storage_config,
        )
    if sha256 is not None and digest != sha256:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        integrity_error(
            uri, f"the {what}'s {received} bytes have SHA-256 {digest} but {sha256} is claimed"
        )
    return path


class Prefetcher(_ClosedOnExit):
    """Downloads claimed objects under custody in one background thread, in the order the
    caller will take them, at most ``lookahead`` objects ahead: the next downloads overlap the
    caller's work on the current one, while the bytes still arrive one object at a time.

    :meth:`close` (also on ``with`` exit) cancels what is queued, stops the download in
    progress and waits for it, so no download outlives the prefetcher; the files it made stay
    in the workspace, which its owner removes.
    """

    def __init__(
        self,
        workspace: Workspace,
        storage_config: StorageConfig,
        *,
        lookahead: int = PREFETCH_OBJECTS,
    ) -> None:
        self._workspace = workspace
        self._storage_config = storage_config
        self._lookahead = max(1, lookahead)
        self._cancel = threading.Event()
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="syvain-fetch")
        self._planned: deque[tuple[Claim, str]] = deque()
        self._started: deque[tuple[Claim, Future[Path]]] = deque()

    def plan(self, claims: Iterable[tuple[Claim, str]]) -> None:
        """Queues (claim, what) downloads; take them in this order."""
        self._planned.extend(claims)
        self._fill()

    def _fill(self) -> None:
        while self._planned and len(self._started) < self._lookahead:
            claim, what = self._planned.popleft()
            future = self._executor.submit(
                fetch,
                claim.uri,
                self._workspace,
                storage_config=self._storage_config,
                size=claim.size,
                sha256=claim.sha256,
                what=what,
                cancel=self._cancel,
            )
            self._started.append((claim, future))

    def take(self, claim: Claim) -> Path:
        """The downloaded, verified file of the next planned claim (which must be ``claim``);
        raises what its download raised."""
        self._fill()
        if not self._started or self._started[0][0] != claim:
            raise RuntimeError(f"{claim.uri} was not the next planned download")
        _, future = self._started.popleft()
        self._fill()  # keep the lookahead while the caller works on this one
        return future.result()

    def close(self) -> None:
        self._cancel.set()
        self._planned.clear()
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._started.clear()
