"""The S3 test server: a throwaway SeaweedFS (``weed mini``) on loopback, or an external one.

The public entry for the tests and benchmarks (``from seaweed import ...``):
``start_seaweed()`` (weed_process.py) runs a server for the duration of a ``with`` block,
``external_server_from_env()`` describes one that is already running, ``SeaweedServer``
(seaweed_server.py) holds its connection facts and sends signed requests (SigV4 in
s3_signing.py), and ``config_for``/``storage_options`` turn it into the package's storage
settings. Only the standard library is used, apart from ``config_for``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from s3_signing import DEFAULT_REGION, canonical_target, sign_headers
from seaweed_server import (
    DEFAULT_BUCKETS,
    LOOPBACK,
    S3Response,
    SeaweedServer,
    SeaweedStartError,
)
from weed_process import find_weed_binary, start_seaweed


def external_server_from_env(
    buckets: Sequence[str] = DEFAULT_BUCKETS,
) -> SeaweedServer | None:
    """An already running S3 server described by ``SYVAIN_TEST_S3_ENDPOINT``,
    ``SYVAIN_TEST_S3_ACCESS_KEY_ID``, ``SYVAIN_TEST_S3_SECRET_ACCESS_KEY`` and optionally
    ``SYVAIN_TEST_S3_REGION``; None when the endpoint is unset. The buckets are created if
    missing."""
    endpoint = os.environ.get("SYVAIN_TEST_S3_ENDPOINT")
    if not endpoint:
        return None
    try:
        key = os.environ["SYVAIN_TEST_S3_ACCESS_KEY_ID"]
        secret = os.environ["SYVAIN_TEST_S3_SECRET_ACCESS_KEY"]
    except KeyError as missing:
        raise SeaweedStartError(
            f"SYVAIN_TEST_S3_ENDPOINT is set but {missing.args[0]} is not"
        ) from None
    server = SeaweedServer(
        endpoint=endpoint.rstrip("/"),
        access_key_id=key,
        secret_access_key=secret,
        region=os.environ.get("SYVAIN_TEST_S3_REGION", DEFAULT_REGION),
        buckets=tuple(buckets),
    )
    server.ensure_buckets(buckets)
    return server


def storage_options(
    server: SeaweedServer, endpoint: str | None = None, *, secret: str | None = None
) -> dict[str, Any]:
    """The S3 keyword arguments of ``SyvainTrainingData`` and ``StorageConfig.create`` for
    ``server`` (or ``endpoint``, e.g. a fault proxy in front of it); ``secret`` replaces the
    secret key."""
    return {
        "s3_base_url": endpoint or server.endpoint,
        "region": server.region,
        "access_key_id": server.access_key_id,
        "secret_access_key": secret or server.secret_access_key,
    }


def config_for(
    server: SeaweedServer, endpoint: str | None = None, *, secret: str | None = None, **extra: Any
) -> Any:
    """A StorageConfig for ``server`` (or ``endpoint``), with its credentials; ``secret``
    replaces the secret key, ``extra`` adds options."""
    from syvain_training_data.storage import StorageConfig

    return StorageConfig.create(**storage_options(server, endpoint, secret=secret), **extra)


__all__ = [
    "DEFAULT_BUCKETS",
    "DEFAULT_REGION",
    "LOOPBACK",
    "S3Response",
    "SeaweedServer",
    "SeaweedStartError",
    "canonical_target",
    "config_for",
    "external_server_from_env",
    "find_weed_binary",
    "sign_headers",
    "start_seaweed",
    "storage_options",
]
