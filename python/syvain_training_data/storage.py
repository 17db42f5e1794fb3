"""Object storage: s3:// through the native client, file:// as the embedded local store.

Every call goes through the Rust extension, which applies the timeouts and the retry budget of
SPEC section 4 and releases the GIL while it waits. Errors:

- ``FileNotFoundError``: the object does not exist (no retry).
- ``FileExistsError``: a create-only write found an existing object.
- ``PermissionError``: the store refused the credentials or the access.
- ``ObjectChangedError``: an immutable object changed while it was read (etag precondition).
- ``StorageRetryExhaustedError`` (a ``RuntimeError``): transient failures spent the budget.
- ``ValueError``: a bad URI or configuration, at once.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from multiprocessing.reduction import ForkingPickler
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, PrivateAttr, SecretStr

from syvain_training_data import _native
from syvain_training_data._native import ObjectStream
from syvain_training_data.errors import ObjectChangedError, StorageRetryExhaustedError

__all__ = [
    "ObjectChangedError",
    "ObjectInfo",
    "ObjectStream",
    "StorageConfig",
    "StorageRetryExhaustedError",
    "delete_object",
    "get_object",
    "head_object",
    "list_objects",
    "open_stream",
    "put_object",
]


class StorageConfig(BaseModel):
    """Where and how to reach the S3-compatible store; file:// URIs need none of it.

    The secret is a ``SecretStr``: it never appears in ``repr``, logs or error messages (a
    value of the wrong type is not echoed in the ValidationError either).

    **Pickling** (savers and datasets travel to worker processes, Ray tasks, other machines,
    and Ray may spill pickles to disk). Two rules, by pickler:

    - multiprocessing's own pickler (``multiprocessing.reduction.ForkingPickler``) carries the
      secret. It is what starts spawn and forkserver processes and what feeds
      ``ProcessPoolExecutor`` calls, ``multiprocessing`` queues and pipes and PyTorch DataLoader
      workers, so a saver or dataset with explicit credentials works in those processes under
      fork, spawn and forkserver with no AWS_* variables. These bytes go through a pipe or a
      local socket to another process, never to a file (or to another machine only through a
      ``multiprocessing.connection`` or manager that you open to it).
    - Every other pickle (``pickle.dumps`` at any protocol, cloudpickle and so Ray,
      ``torch.save``) holds no secret unless ``picklable_secret=True``. Unpickled, such a config
      takes the secret again from the process's ``AWS_SECRET_ACCESS_KEY``, provided
      ``AWS_ACCESS_KEY_ID`` there names the config's access key (set on Ray workers through
      the environment of each node's ``ray start``). Without it, the first request fails with a
      ValueError saying so.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, hide_input_in_errors=True)

    s3_base_url: str | None = None
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: SecretStr | None = None
    virtual_hosted_style_request: bool = False
    picklable_secret: bool = False

    # Set on an unpickled config whose secret was withheld and not found in the environment.
    _secret_withheld: bool = PrivateAttr(default=False)

    def __getstate__(self) -> dict[Any, Any]:
        """The state of a plain pickle: the secret withheld unless ``picklable_secret`` (a
        config already unpickled without it stays withheld: the next process looks in its own
        environment too). multiprocessing's pickler uses :func:`_reduce_for_processes`."""
        state = super().__getstate__()
        if not self.picklable_secret and (
            self.secret_access_key is not None or self._secret_withheld
        ):
            state["__dict__"] = {**state["__dict__"], "secret_access_key": None}
            private = state.get("__pydantic_private__") or {}
            state["__pydantic_private__"] = {**private, "_secret_withheld": False}
            state[_WITHHELD] = True
        return state

    def __setstate__(self, state: dict[Any, Any]) -> None:
        state = dict(state)
        if state.pop(_WITHHELD, False):
            fields = dict(state["__dict__"])
            secret = _secret_from_environment(fields["access_key_id"])
            if secret is None:
                private = state.get("__pydantic_private__") or {}
                state["__pydantic_private__"] = {**private, "_secret_withheld": True}
            else:
                fields["secret_access_key"] = SecretStr(secret)
            state["__dict__"] = fields
        super().__setstate__(state)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        # ForkingPickler looks its reducers up by exact type: register subclasses too.
        super().__pydantic_init_subclass__(**kwargs)
        ForkingPickler.register(cls, _reduce_for_processes)

    @classmethod
    def create(
        cls,
        *,
        s3_base_url: str | None = None,
        region: str = "us-east-1",
        access_key_id: str | None = None,
        secret_access_key: str | SecretStr | None = None,
        virtual_hosted_style_request: bool = False,
        picklable_secret: bool = False,
    ) -> StorageConfig:
        """Builds a config from plain strings (the secret is wrapped as a ``SecretStr``)."""
        secret = (
            SecretStr(secret_access_key)
            if isinstance(secret_access_key, str)
            else secret_access_key
        )
        return cls(
            s3_base_url=s3_base_url,
            region=region,
            access_key_id=access_key_id,
            secret_access_key=secret,
            virtual_hosted_style_request=virtual_hosted_style_request,
            picklable_secret=picklable_secret,
        )


_WITHHELD: Final = "syvain_secret_withheld"


def _reduce_for_processes(config: StorageConfig) -> tuple[Any, ...]:
    """How ``ForkingPickler`` (process start, pool queues, pipes) pickles a config: with its
    secret, since those bytes go straight to another local process. A config whose secret was
    already withheld goes as a plain pickle would (the receiver looks in its environment)."""
    state = config.__getstate__() if config._secret_withheld else BaseModel.__getstate__(config)
    return (_restore, (type(config), state))


def _restore(cls: type[StorageConfig], state: dict[Any, Any]) -> StorageConfig:
    config = cls.__new__(cls)
    config.__setstate__(state)
    return config


ForkingPickler.register(StorageConfig, _reduce_for_processes)


def _secret_from_environment(access_key_id: str | None) -> str | None:
    """``AWS_SECRET_ACCESS_KEY`` of this process, if ``AWS_ACCESS_KEY_ID`` names the same key
    (a secret is never paired with another key's id)."""
    if os.environ.get("AWS_ACCESS_KEY_ID") != access_key_id:
        return None
    return os.environ.get("AWS_SECRET_ACCESS_KEY") or None


LOCAL_ONLY = StorageConfig()


class ObjectInfo(BaseModel):
    """An object's URI, size in bytes and etag ("" where the store gives none)."""

    model_config = ConfigDict(frozen=True)

    uri: str
    size: int
    etag: str


@functools.lru_cache(maxsize=64)
def native_storage(config: StorageConfig) -> _native.NativeStorage:
    """The native client for a config (one per config; it rebuilds its connections after fork).

    Raises ValueError at once for an invalid ``s3_base_url``, or for an unpickled config
    whose secret was not pickled and is not in this process's environment.
    """
    if config._secret_withheld:
        raise ValueError(
            f"The secret access key of access key id {config.access_key_id!r} was not pickled "
            "with this storage configuration: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "in this process's environment, or build the client with picklable_secret=True"
        )
    secret = config.secret_access_key.get_secret_value() if config.secret_access_key else None
    return _native.NativeStorage(
        s3_base_url=config.s3_base_url,
        region=config.region,
        access_key_id=config.access_key_id,
        secret_access_key=secret,
        virtual_hosted_style_request=config.virtual_hosted_style_request,
    )


def _client(storage_config: StorageConfig | None) -> _native.NativeStorage:
    return native_storage(storage_config or LOCAL_ONLY)


def get_object(uri: str, *, storage_config: StorageConfig | None = None) -> bytes:
    """The whole object. Raises FileNotFoundError when it does not exist."""
    return _client(storage_config).get(uri)


def head_object(uri: str, *, storage_config: StorageConfig | None = None) -> ObjectInfo:
    """Size and etag of an object. Raises FileNotFoundError when it does not exist."""
    size, etag = _client(storage_config).head(uri)
    return ObjectInfo(uri=uri, size=size, etag=etag)


def put_object(
    uri: str,
    data: bytes,
    *,
    storage_config: StorageConfig | None = None,
    content_type: str | None = None,
    metadata: Mapping[str, str] | None = None,
    create_only: bool = False,
) -> ObjectInfo:
    """Writes an object. With ``create_only`` an existing object raises FileExistsError.

    ``content_type`` and ``metadata`` become object attributes on S3; the local directory store
    keeps only the bytes.
    """
    size, etag = _client(storage_config).put(
        uri,
        data,
        content_type=content_type,
        metadata=dict(metadata) if metadata else None,
        create_only=create_only,
    )
    return ObjectInfo(uri=uri, size=size, etag=etag)


def delete_object(uri: str, *, storage_config: StorageConfig | None = None) -> None:
    """Deletes an object; a missing one is not an error."""
    _client(storage_config).delete(uri)


def list_objects(
    prefix_uri: str, *, storage_config: StorageConfig | None = None
) -> list[ObjectInfo]:
    """Every object under a prefix, sorted by URI. The prefix is a "directory":
    ``s3://b/a`` lists ``s3://b/a/...``, not ``s3://b/ab``."""
    return [
        ObjectInfo(uri=uri, size=size, etag=etag)
        for uri, size, etag in _client(storage_config).list(prefix_uri)
    ]


def open_stream(
    uri: str,
    *,
    size_bytes: int,
    etag: str | None = None,
    start: int = 0,
    storage_config: StorageConfig | None = None,
) -> ObjectStream:
    """A resumable stream over an immutable object of known size.

    Ranged GETs with If-Match on ``etag`` (or on the first response's etag) resume at the last
    received byte after transient failures; at most ``READAHEAD_BYTES`` are buffered ahead.
    Iterate for ``bytes`` chunks, or call ``read(n)``. Close it (or use ``with``) to stop early.
    """
    return _client(storage_config).open_stream(uri, size_bytes, etag=etag, start=start)
