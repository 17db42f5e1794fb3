"""`SyvainTrainingData`: one store configuration, and what reads and writes datasets through it
(manifests, savers, loaders, representation examples)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Unpack

from pydantic import SecretStr, ValidationError

from syvain_training_data.credentials import provider_name
from syvain_training_data.manifest import (
    DataManifest,
    canonical_manifest_bytes,
    parse_manifest,
    read_manifest_bytes,
    validate_manifest,
)
from syvain_training_data.storage import (
    StorageConfig,
    check_storage_config,
    put_object,
)

if TYPE_CHECKING:
    from syvain_training_data.loading.split_loader import SplitDataLoader
    from syvain_training_data.manifest import DataManifestDataFormat
    from syvain_training_data.publish import DatasetSaver
    from syvain_training_data.representation import RepresentationExample
    from syvain_training_data.representation.examples import ExampleSelection

__all__ = ["SyvainTrainingData"]


class SyvainTrainingData:
    """Client for one S3-compatible endpoint; file:///absolute/path URIs need no endpoint.

    ``SyvainTrainingData()`` with no arguments works with the local directory store only.
    Raises ValueError at once for an invalid ``s3_base_url``. The secret never appears in the
    client's ``repr``, in logs or in error messages. Savers and datasets reach
    ``ProcessPoolExecutor`` and DataLoader workers with it (multiprocessing's own pickler carries
    it, under fork, spawn and forkserver), but a plain pickle or cloudpickle (Ray) of the client,
    its savers or datasets holds no secret unless ``picklable_secret=True``: such a copy takes it
    again from its process's ``AWS_SECRET_ACCESS_KEY`` (see
    :class:`~syvain_training_data.storage.StorageConfig`). The session token is handled exactly
    like the secret.

    Credentials (one source): ``access_key_id`` + ``secret_access_key`` (+ ``session_token``);
    ``skip_signature=True`` for a public bucket; ``credential_provider`` (a picklable callable
    returning ``access_key_id``, ``secret_access_key`` and optional ``session_token`` and
    ``expires_at``); ``profile`` (an AWS profile, through botocore: the ``aws`` extra); or none
    of them: the AWS SDKs' default chain, resolved when an s3:// request is first signed.

    ``hf_token``: the Hugging Face Hub's access token for hf:// URIs (a gated or private
    dataset); ``HF_TOKEN`` when not given. Kept like the secret (never in a ``repr``, log,
    error or plain pickle) and sent only to the Hub's host. ``allow_http=True`` lets plain
    ``http://`` URIs be read (from a server you trust); without it they are a ValueError.
    """

    def __init__(
        self,
        *,
        s3_base_url: str | None = None,
        region: str = "us-east-1",
        access_key_id: str | None = None,
        secret_access_key: str | SecretStr | None = None,
        virtual_hosted_style_request: bool = False,
        picklable_secret: bool = False,
        session_token: str | SecretStr | None = None,
        skip_signature: bool = False,
        credential_provider: Callable[[], Mapping[str, Any]] | None = None,
        profile: str | None = None,
        allow_http: bool = False,
        hf_token: str | SecretStr | None = None,
    ) -> None:
        self._storage_config = StorageConfig.create(
            s3_base_url=s3_base_url,
            region=region,
            access_key_id=access_key_id,
            secret_access_key=secret_access_key,
            session_token=session_token,
            virtual_hosted_style_request=virtual_hosted_style_request,
            skip_signature=skip_signature,
            credential_provider=credential_provider,
            profile=profile,
            picklable_secret=picklable_secret,
            allow_http=allow_http,
            hf_token=hf_token,
        )
        if profile is not None:
            from syvain_training_data.aws import require_botocore

            require_botocore(f"profile {profile!r}")  # asked for by name: fail now, not later
        check_storage_config(self._storage_config)  # validates the endpoint now, not on first use

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        picklable_secret: bool = False,
        allow_http: bool = False,
    ) -> SyvainTrainingData:
        """A client from the standard AWS variables: AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL,
        AWS_REGION or AWS_DEFAULT_REGION (default us-east-1), and the first of:
        AWS_SKIP_SIGNATURE=true (unsigned requests); AWS_ACCESS_KEY_ID and
        AWS_SECRET_ACCESS_KEY (with AWS_SESSION_TOKEN); AWS_PROFILE (through botocore, the
        ``aws`` extra); otherwise the default chain, resolved when a request is signed. The
        Hub's token is ``HF_TOKEN`` (read when an hf:// store is built); ``allow_http`` as
        for the constructor."""
        env = os.environ if environ is None else environ
        skip = (env.get("AWS_SKIP_SIGNATURE") or "").strip().lower() in {"1", "true", "yes"}
        key_id = None if skip else env.get("AWS_ACCESS_KEY_ID") or None
        secret = None if skip else env.get("AWS_SECRET_ACCESS_KEY") or None
        keys = key_id is not None or secret is not None
        # Built without the constructor's botocore check: with AWS_PROFILE set and no botocore,
        # file:// still works and the first s3:// request names the extra.
        client = cls.__new__(cls)
        client._storage_config = StorageConfig.create(
            s3_base_url=env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None,
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
            access_key_id=key_id,
            secret_access_key=secret,
            session_token=(env.get("AWS_SESSION_TOKEN") or None) if keys else None,
            skip_signature=skip,
            profile=None if skip or keys else env.get("AWS_PROFILE") or None,
            picklable_secret=picklable_secret,
            allow_http=allow_http,
        )
        check_storage_config(client._storage_config)
        return client

    @property
    def storage_config(self) -> StorageConfig:
        return self._storage_config

    def __repr__(self) -> str:
        config = self._storage_config
        parts = [
            f"s3_base_url={config.s3_base_url!r}",
            f"region={config.region!r}",
            f"access_key_id={config.access_key_id!r}",
            f"secret_access_key={'***' if config.secret_access_key else None}",
        ]
        if config.session_token is not None:
            parts.append("session_token=***")
        parts.append(f"virtual_hosted_style_request={config.virtual_hosted_style_request!r}")
        if config.skip_signature:
            parts.append("skip_signature=True")
        if config.credential_provider is not None:
            parts.append(f"credential_provider={provider_name(config.credential_provider)}")
        if config.profile is not None:
            parts.append(f"profile={config.profile!r}")
        if config.allow_http:
            parts.append("allow_http=True")
        if config.hf_token is not None:
            parts.append("hf_token=***")
        return f"SyvainTrainingData({', '.join(parts)})"

    def load_manifest(self, uri: str) -> DataManifest:
        """Reads and validates a manifest.

        The object's size is checked with a HEAD first: a manifest over 256 MiB
        (``manifest.MAX_MANIFEST_BYTES``) is refused before any of it is read. It is then read
        once, into one buffer, and parsed once.

        Raises FileNotFoundError (no such object), PermissionError, ValueError (too large, not
        UTF-8, not JSON, invalid shape: the message says which and names the URI).
        """
        data = read_manifest_bytes(uri, storage_config=self._storage_config)
        return parse_manifest(data, uri)

    def save_manifest(
        self, uri: str, manifest: DataManifest | Mapping[str, object]
    ) -> DataManifest:
        """Validates and writes a manifest as its canonical bytes (Content-Type
        application/json), replacing any object at ``uri``. Returns the validated manifest.

        Raises ValueError ("Data manifest has invalid shape: {uri}") for an invalid mapping.
        """
        try:
            validated = validate_manifest(manifest)
        except ValidationError as error:
            raise ValueError(f"Data manifest has invalid shape: {uri}\n{error}") from error
        put_object(
            uri,
            canonical_manifest_bytes(validated),
            storage_config=self._storage_config,
            content_type="application/json",
        )
        return validated

    def dataset_saver(
        self, manifest_uri: str, *, data_format: DataManifestDataFormat = "jsonl.gz"
    ) -> DatasetSaver:
        """A :class:`~syvain_training_data.publish.DatasetSaver` publishing the dataset whose
        manifest goes to ``manifest_uri`` (SPEC section 5). Picklable: hand it to workers.

        Raises ValueError for a prefix (ending in "/") or invalid URI, or an unknown format.
        """
        from syvain_training_data.publish import DatasetSaver

        return DatasetSaver(
            manifest_uri, data_format=data_format, storage_config=self._storage_config
        )

    def split_data_loader(
        self,
        manifest_uri: str,
        collate_fn: Callable[[list[Any]], Any] | None,
        dataloader_args: Mapping[str, Any] | None = None,
        *,
        allow_mixed_schemes: bool = False,
    ) -> SplitDataLoader:
        """A :class:`~syvain_training_data.SplitDataLoader` over the manifest at
        ``manifest_uri``, read once, now (SPEC section 6). Needs the ``torch`` extra.
        ``collate_fn`` may be None for ``load_tokens``, ``load(columns=...)`` or torch's
        default collation.

        An ``s3://`` manifest may name only ``s3://`` shards and a ``file://`` manifest only
        ``file://`` shards (SPEC section 4); pass ``allow_mixed_schemes=True`` for a manifest you
        trust that mixes them.

        Raises ValueError for ``collate_fn`` inside ``dataloader_args`` or a negative
        ``num_workers``, or a shard whose scheme is not the manifest's; the errors of
        :meth:`load_manifest`; ModuleNotFoundError without torch.
        """
        from syvain_training_data.loading.split_loader import SplitDataLoader

        return SplitDataLoader(
            self.load_manifest(manifest_uri),
            collate_fn,
            dataloader_args,
            storage_config=self._storage_config,
            manifest_uri=manifest_uri,
            allow_mixed_schemes=allow_mixed_schemes,
        )

    def iter_representation_examples(
        self,
        manifest_uri: str,
        manifest_sha256: str,
        **selection: Unpack[ExampleSelection],
    ) -> Iterator[RepresentationExample]:
        """Verified examples of the OLMo 3 representation publication (SPEC section 7): the
        first ``per_source_count`` blocks by block_id of each source, in the order of
        ``sources``, each joined to its 32 teacher projections for (``teacher_layer``,
        ``state_kind``), all keyword arguments
        (:class:`~syvain_training_data.representation.examples.ExampleSelection`). Needs the
        ``representation`` extra.

        Arguments are checked now (TypeError, ValueError); the publication is downloaded and
        verified on the first ``next()``, and nothing is yielded until every check has passed.
        Raises RepresentationIntegrityError for any custody or schema failure, ValueError when a
        source has too few examples, ModuleNotFoundError without the extra; see
        :func:`syvain_training_data.representation.iter_representation_examples`.
        """
        from syvain_training_data.representation import iter_representation_examples

        return iter_representation_examples(
            manifest_uri, manifest_sha256, storage_config=self._storage_config, **selection
        )
