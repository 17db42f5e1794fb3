"""Object storage through the native client: s3://, gs://, file:// (the embedded local store),
and read-only https:// (http:// with ``allow_http``) and hf://.

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
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.reduction import ForkingPickler
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, PrivateAttr, SecretStr, model_validator

from syvain_training_data import _native
from syvain_training_data._native import ObjectStream
from syvain_training_data.credentials import provider_for
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

    **Credentials**, one source per config (a ``ValueError`` names the conflict otherwise):

    - ``access_key_id`` + ``secret_access_key``, with ``session_token`` for temporary
      credentials (STS, SSO, an assumed role): sent as ``x-amz-security-token``.
    - ``skip_signature=True``: unsigned requests (a public bucket), no ``Authorization`` header.
    - ``credential_provider``: a picklable callable returning a mapping with
      ``access_key_id``, ``secret_access_key``, optional ``session_token`` and optional
      ``expires_at`` (an aware ``datetime``); called again shortly before ``expires_at``. A bad
      answer fails the request with a TypeError (wrong type) or ValueError naming the provider
      and the field, never a value; so does an exception it raises (a ValueError).
    - ``profile``: an AWS profile of ``~/.aws/config`` and ``credentials`` (SSO,
      ``credential_process``, assume-role), through botocore (the ``aws`` extra).
    - none of these: the AWS SDKs' default chain, resolved in each process when it first
      signs a request: the environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
      ``AWS_SESSION_TOKEN``), ``AWS_PROFILE`` (through botocore), web identity, container
      credentials, then EC2 instance metadata (IMDSv2).

    The secret and the session token are ``SecretStr``: they never appear in ``repr``, logs or
    error messages (a value of the wrong type is not echoed in the ValidationError either).

    **Other stores.** ``hf_token``: the Hugging Face Hub's access token for hf:// URIs (gated
    and private datasets), sent only to the Hub's own host (never across a redirect to its
    CDN); without it, ``HF_TOKEN`` of the process that reads. It is a ``SecretStr`` pickled by
    the rules below like the secret (a plain pickle without it takes ``HF_TOKEN`` again).
    ``allow_http``: plain ``http://`` object URIs (and an ``http://`` ``HF_ENDPOINT``) are read
    only with ``allow_http=True``, for a server you trust (nothing protects the bytes or a
    token on the way); otherwise reading one is a ValueError at the call. An ``http://``
    ``s3_base_url`` needs no opt-in: giving it is the choice.

    **Pickling** (savers and datasets travel to worker processes, Ray tasks, other machines,
    and Ray may spill pickles to disk). Two rules, by pickler:

    - multiprocessing's own pickler (``multiprocessing.reduction.ForkingPickler``) carries the
      secret and the session token. It is what starts spawn and forkserver processes and what
      feeds ``ProcessPoolExecutor`` calls, ``multiprocessing`` queues and pipes and PyTorch
      DataLoader workers, so a saver or dataset with explicit credentials works in those
      processes under fork, spawn and forkserver with no AWS_* variables. These bytes go
      through a pipe or a local socket to another process, never to a file (or to another
      machine only through a ``multiprocessing.connection`` or manager that you open to it).
    - Every other pickle (``pickle.dumps`` at any protocol, cloudpickle and so Ray,
      ``torch.save``) holds neither unless ``picklable_secret=True``. Unpickled, such a config
      takes them again from the process's ``AWS_SECRET_ACCESS_KEY`` (and
      ``AWS_SESSION_TOKEN``, if it had a token), provided ``AWS_ACCESS_KEY_ID`` there names the
      config's access key (set on Ray workers through the environment of each node's
      ``ray start``). Without them, the first request fails with a ValueError saying so.
    - A ``credential_provider`` pickles as itself (it holds no credentials, so each worker or
      Ray task resolves its own); a profile or the default chain is resolved again in each
      process.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, hide_input_in_errors=True)

    s3_base_url: str | None = None
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: SecretStr | None = None
    session_token: SecretStr | None = None
    virtual_hosted_style_request: bool = False
    skip_signature: bool = False
    credential_provider: Callable[[], Mapping[str, Any]] | None = None
    profile: str | None = None
    picklable_secret: bool = False
    allow_http: bool = False
    hf_token: SecretStr | None = None

    # Set on an unpickled config whose secret (and session token) was withheld and not found
    # in the environment.
    _secret_withheld: bool = PrivateAttr(default=False)
    _token_withheld: bool = PrivateAttr(default=False)
    # Likewise for the Hub token (not found in HF_TOKEN).
    _hf_token_withheld: bool = PrivateAttr(default=False)

    @model_validator(mode="after")
    def _one_credential_source(self) -> StorageConfig:
        keys = self.access_key_id is not None or self.secret_access_key is not None
        if self.session_token is not None and not keys:
            raise ValueError("session_token needs access_key_id and secret_access_key")
        sources = [
            name
            for name, given in (
                ("access_key_id/secret_access_key", keys),
                ("skip_signature", self.skip_signature),
                ("credential_provider", self.credential_provider is not None),
                ("profile", self.profile is not None),
            )
            if given
        ]
        if len(sources) > 1:
            raise ValueError(f"give one source of credentials, not {' and '.join(sources)}")
        if (self.access_key_id is None) != (self.secret_access_key is None):
            given, missing = ("access_key_id", "secret_access_key")[
                :: 1 if self.access_key_id else -1
            ]
            raise ValueError(
                f"{given} needs {missing}: pass both, or neither (then the environment's "
                "credentials, a profile or a credential_provider are used)"
            )
        if self.hf_token is not None and not self.hf_token.get_secret_value():
            raise ValueError("hf_token is empty: pass a Hub token, or None for HF_TOKEN")
        url = self.s3_base_url
        if url is not None and not url.lower().startswith(("http://", "https://")):
            raise ValueError(f'Invalid s3_base_url "{url}": expected http(s)://host[:port]')
        return self

    def __hash__(self) -> int:
        # Configs key the native client cache: a provider that cannot be hashed (a dataclass
        # with eq=True, say) hashes by its type, which keeps equal configs' hashes equal.
        provider: Any = self.credential_provider
        try:
            provider_key = hash(provider)
        except TypeError:
            provider_key = hash(type(provider))
        return hash(
            (
                self.s3_base_url,
                self.region,
                self.access_key_id,
                self.secret_access_key,
                self.session_token,
                self.virtual_hosted_style_request,
                self.skip_signature,
                provider_key,
                self.profile,
                self.picklable_secret,
                self.allow_http,
                self.hf_token,
            )
        )

    @property
    def credential_source(self) -> str:
        """``"static"``, ``"unsigned"``, ``"provider"``, ``"profile"`` or ``"chain"``."""
        if self.skip_signature:
            return "unsigned"
        if self.credential_provider is not None:
            return "provider"
        if self.profile is not None:
            return "profile"
        if self.access_key_id is not None or self.secret_access_key is not None:
            return "static"
        return "chain"

    def __getstate__(self) -> dict[Any, Any]:
        """The state of a plain pickle: the secret and session token withheld unless
        ``picklable_secret`` (a config already unpickled without them stays withheld: the next
        process looks in its own environment too). multiprocessing's pickler uses
        :func:`_reduce_for_processes`."""
        state = super().__getstate__()
        if not self.picklable_secret and (self.hf_token is not None or self._hf_token_withheld):
            state["__dict__"] = {**state["__dict__"], "hf_token": None}
            state["__pydantic_private__"] = {
                **(state.get("__pydantic_private__") or {}),
                "_hf_token_withheld": False,
            }
            state[_HF_WITHHELD] = True
        if not self.picklable_secret and (
            self.secret_access_key is not None
            or self.session_token is not None
            or self._secret_withheld
        ):
            had_token = self.session_token is not None or self._token_withheld
            fields = state["__dict__"]
            state["__dict__"] = {**fields, "secret_access_key": None, "session_token": None}
            private = state.get("__pydantic_private__") or {}
            state["__pydantic_private__"] = {
                **private,
                "_secret_withheld": False,
                "_token_withheld": False,
            }
            state[_WITHHELD] = _TOKEN if had_token else True
        return state

    def __setstate__(self, state: dict[Any, Any]) -> None:
        state = dict(state)
        withheld = state.pop(_WITHHELD, False)
        hf_withheld = state.pop(_HF_WITHHELD, False)
        fields = {**_NEW_FIELDS, **state["__dict__"]}  # pickled by an older version
        private = {"_secret_withheld": False, "_token_withheld": False, "_hf_token_withheld": False}
        private.update(state.get("__pydantic_private__") or {})
        if hf_withheld:
            hub_token = os.environ.get("HF_TOKEN") or None
            if hub_token is None:
                private["_hf_token_withheld"] = True
            else:
                fields["hf_token"] = SecretStr(hub_token)
        if withheld:
            secret = _secret_from_environment(fields["access_key_id"])
            token = os.environ.get("AWS_SESSION_TOKEN") or None
            if secret is None or (withheld == _TOKEN and token is None):
                private["_secret_withheld"] = True
                private["_token_withheld"] = withheld == _TOKEN
            else:
                fields["secret_access_key"] = SecretStr(secret)
                if withheld == _TOKEN and token is not None:
                    fields["session_token"] = SecretStr(token)
        state["__dict__"] = fields
        state["__pydantic_private__"] = private
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
        session_token: str | SecretStr | None = None,
        virtual_hosted_style_request: bool = False,
        skip_signature: bool = False,
        credential_provider: Callable[[], Mapping[str, Any]] | None = None,
        profile: str | None = None,
        picklable_secret: bool = False,
        allow_http: bool = False,
        hf_token: str | SecretStr | None = None,
    ) -> StorageConfig:
        """Builds a config from plain strings (the secret and token are wrapped as
        ``SecretStr``)."""
        return cls(
            s3_base_url=s3_base_url,
            region=region,
            access_key_id=access_key_id,
            secret_access_key=_secret(secret_access_key),
            session_token=_secret(session_token),
            virtual_hosted_style_request=virtual_hosted_style_request,
            skip_signature=skip_signature,
            credential_provider=credential_provider,
            profile=profile,
            picklable_secret=picklable_secret,
            allow_http=allow_http,
            hf_token=_secret(hf_token),
        )


def _secret(value: str | SecretStr | None) -> SecretStr | None:
    return SecretStr(value) if isinstance(value, str) else value


_WITHHELD: Final = "syvain_secret_withheld"
# Set in a plain pickle's state when the Hub token was withheld.
_HF_WITHHELD: Final = "syvain_hf_token_withheld"
# The value of _WITHHELD when a session token was withheld with the secret.
_TOKEN: Final = "secret+token"
# Fields added since the first pickled configs, with their defaults.
_NEW_FIELDS: Final[dict[str, Any]] = {
    "session_token": None,
    "skip_signature": False,
    "credential_provider": None,
    "profile": None,
    "allow_http": False,
    "hf_token": None,
}


def _reduce_for_processes(config: StorageConfig) -> tuple[Any, ...]:
    """How ``ForkingPickler`` (process start, pool queues, pipes) pickles a config: with its
    secret, session token and Hub token, since those bytes go straight to another local
    process. One already withheld stays withheld (the receiver looks in its environment)."""
    state = BaseModel.__getstate__(config)
    if config._secret_withheld or config._hf_token_withheld:
        state["__pydantic_private__"] = {
            **(state.get("__pydantic_private__") or {}),
            "_secret_withheld": False,
            "_token_withheld": False,
            "_hf_token_withheld": False,
        }
        if config._secret_withheld:
            state[_WITHHELD] = _TOKEN if config._token_withheld else True
        if config._hf_token_withheld:
            state[_HF_WITHHELD] = True
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
    whose secret was not pickled and is not in this process's environment;
    ModuleNotFoundError for a ``profile`` without botocore (the ``aws`` extra).
    """
    if config._secret_withheld:
        what = (
            "secret access key and session token" if config._token_withheld else "secret access key"
        )
        variables = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" + (
            " and AWS_SESSION_TOKEN" if config._token_withheld else ""
        )
        raise ValueError(
            f"The {what} of access key id {config.access_key_id!r} was not pickled "
            f"with this storage configuration: set {variables} "
            "in this process's environment, or build the client with picklable_secret=True"
        )
    if config._hf_token_withheld:
        raise ValueError(
            "The Hub token (hf_token) was not pickled with this storage configuration: set "
            "HF_TOKEN in this process's environment, or build the client with "
            "picklable_secret=True"
        )
    secret = config.secret_access_key.get_secret_value() if config.secret_access_key else None
    token = config.session_token.get_secret_value() if config.session_token else None
    return _native.NativeStorage(
        s3_base_url=config.s3_base_url,
        region=config.region,
        access_key_id=config.access_key_id,
        secret_access_key=secret,
        session_token=token,
        virtual_hosted_style_request=config.virtual_hosted_style_request,
        skip_signature=config.skip_signature,
        credential_provider=provider_for(config),
        allow_http=config.allow_http,
        hf_token=config.hf_token.get_secret_value() if config.hf_token else None,
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
    data: bytes | Sequence[bytes],
    *,
    storage_config: StorageConfig | None = None,
    content_type: str | None = None,
    metadata: Mapping[str, str] | None = None,
    create_only: bool = False,
) -> ObjectInfo:
    """Writes an object from bytes, or from a sequence of chunks sent without being joined.
    With ``create_only`` an existing object raises FileExistsError.

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
    end: int | None = None,
    storage_config: StorageConfig | None = None,
) -> ObjectStream:
    """A resumable stream over bytes ``[start, end)`` (``end``: default ``size_bytes``) of an
    immutable object of known size.

    Ranged GETs with If-Match on ``etag`` (or on the first response's etag) resume at the last
    received byte after transient failures; at most ``READAHEAD_BYTES`` are buffered ahead.
    Iterate for ``bytes`` chunks, or call ``read(n)``. Close it (or use ``with``) to stop early.
    """
    return _client(storage_config).open_stream(uri, size_bytes, etag=etag, start=start, end=end)


def read_range(
    uri: str,
    *,
    size_bytes: int,
    start: int,
    end: int,
    etag: str | None = None,
    storage_config: StorageConfig | None = None,
) -> bytes:
    """Bytes ``[start, end)`` (``start < end``) of an immutable object of ``size_bytes`` bytes,
    read whole: a local file's by one read, without a stream; elsewhere as
    :func:`open_stream` reads them (resumed, held to ``etag``)."""
    return _client(storage_config).read_range(uri, size_bytes, start=start, end=end, etag=etag)


def put_file(
    uri: str,
    path: str | os.PathLike[str],
    *,
    storage_config: StorageConfig | None = None,
    content_type: str | None = None,
    metadata: Mapping[str, str] | None = None,
    create_only: bool = False,
    single_put_max: int = _native.SINGLE_PUT_MAX,
    multipart_threshold: int = _native.MULTIPART_THRESHOLD,
    part_size: int = _native.PART_SIZE,
) -> ObjectInfo:
    """Uploads a local file as an object: one PUT up to ``multipart_threshold`` bytes (and a
    create-only one up to ``single_put_max``), else a multipart upload streamed from the file in
    ``part_size`` parts. Errors as :func:`put_object`."""
    size, etag = _native.put_file(
        _client(storage_config),
        uri,
        path,
        content_type=content_type,
        metadata=dict(metadata) if metadata else None,
        create_only=create_only,
        single_put_max=single_put_max,
        multipart_threshold=multipart_threshold,
        part_size=part_size,
    )
    return ObjectInfo(uri=uri, size=size, etag=etag)


def download_object(
    uri: str,
    path: str | os.PathLike[str],
    *,
    size_bytes: int,
    etag: str | None = None,
    cancel: Any = None,
    storage_config: StorageConfig | None = None,
) -> tuple[int, str]:
    """Streams an immutable object of ``size_bytes`` bytes into a new file at ``path`` and
    returns (size, lowercase hex SHA-256); see ``_native.download_object`` for ``cancel`` and
    the errors. On every error the file is removed."""
    return _native.download_object(
        _client(storage_config), uri, path, size_bytes=size_bytes, etag=etag, cancel=cancel
    )


def open_shard(
    uri: str, data_format: str, *, storage_config: StorageConfig | None = None, **read: Any
) -> _native.ShardReader:
    """A msgpack.zstf or jsonl.gz shard decoded off the GIL; ``read`` are the keyword arguments
    of ``NativeStorage.open_shard`` (size, records, etag, range, segment, readahead)."""
    return _client(storage_config).open_shard(uri, data_format, **read)


def open_shard_batches(
    uri: str, data_format: str, *, storage_config: StorageConfig | None = None, **read: Any
) -> _native.ShardBatchReader:
    """Arrow record batches of a msgpack.zstf or jsonl.gz shard, built off the GIL; ``read``
    are the keyword arguments of ``NativeStorage.open_shard_batches``."""
    return _client(storage_config).open_shard_batches(uri, data_format, **read)


def open_parquet(
    uri: str, storage_config: StorageConfig | None = None, **read: Any
) -> _native.ParquetBatchReader:
    """A Parquet shard read in place, its footer fetched now; ``read`` are the keyword
    arguments of ``NativeStorage.open_parquet`` (size, etag, rows, columns, batch rows)."""
    return _client(storage_config).open_parquet(uri, **read)


def check_storage_config(storage_config: StorageConfig) -> None:
    """Builds the config's native client now, so that a bad endpoint or a withheld secret fails
    here rather than on the first request (see :func:`native_storage`)."""
    native_storage(storage_config)
