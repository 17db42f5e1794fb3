"""Shared pytest fixtures: one SeaweedFS for the session, a fault proxy per test.

Fixtures
--------
``seaweed``        (session) ``SeaweedServer`` with ``endpoint``, ``access_key_id``,
                   ``secret_access_key``, ``region``, ``buckets``; see ``tests/seaweed.py``.
                   Started lazily by the first test that asks for it, stopped at session end.
                   Set ``SYVAIN_TEST_S3_ENDPOINT``, ``SYVAIN_TEST_S3_ACCESS_KEY_ID`` and
                   ``SYVAIN_TEST_S3_SECRET_ACCESS_KEY`` (optionally ``SYVAIN_TEST_S3_REGION``)
                   to use an already running server instead.
``s3_bucket``      (session) the test bucket name (``"syvain-test"``).
``unique_prefix``  a fresh key prefix per test, e.g. ``"test_put-1f0c9a..."``: no leading or
                   trailing slash, so use ``f"s3://{s3_bucket}/{unique_prefix}/name"``.
``fault_proxy``    a started ``FaultProxy`` in front of the S3 server, stopped after the test;
                   script faults with ``fault_proxy.script(...)``, see ``tests/fault_proxy.py``.
``store_root``     ``(root_uri, StorageConfig)``, once on SeaweedFS (a fresh prefix) and once on
                   the local directory store (``tmp_path / "store"``). SeaweedFS starts only for
                   the s3 case, so ``-k file`` runs need no server.
``s3_env``         sets the S3 server's credentials in the environment (where pickled configs
                   and spawned workers take the secret from) and returns the server.

The helper modules are plain modules in this directory (``from seaweed import ...``,
``from fault_proxy import ...``, ``from memory import run_child``); only ``store_root`` imports
``syvain_training_data``, lazily.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:  # also under --import-mode=importlib
    sys.path.insert(0, _TESTS_DIR)

from fault_proxy import FaultProxy  # noqa: E402
from seaweed import SeaweedServer, external_server_from_env, start_seaweed  # noqa: E402

# A client without credentials resolves the AWS default chain, whose last source is the EC2
# instance metadata service: no test may reach 169.254.169.254 (tests that exercise it point
# AWS_EC2_METADATA_SERVICE_ENDPOINT at a server of their own on 127.0.0.1). Inherited by every
# child process and command the tests start.
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"

TEST_BUCKET = "syvain-test"
DATA_BUCKET = "syvain-data"


@pytest.fixture(scope="session")
def seaweed() -> Iterator[SeaweedServer]:
    """The session's S3 server: an external one from the environment, else our weed mini."""
    external = external_server_from_env((TEST_BUCKET, DATA_BUCKET))
    if external is not None:
        yield external
        return
    with start_seaweed((TEST_BUCKET, DATA_BUCKET)) as server:
        yield server


@pytest.fixture(scope="session")
def s3_bucket(seaweed: SeaweedServer) -> str:
    """Name of the bucket tests write to (session scope, so module fixtures may use it)."""
    return TEST_BUCKET


@pytest.fixture
def unique_prefix(request: pytest.FixtureRequest) -> str:
    """A key prefix no other test (or run) uses: the sanitized test name plus a uuid."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", request.node.name).strip("_.")[:60]
    return f"{name or 'test'}-{uuid.uuid4().hex}"


@pytest.fixture
def fault_proxy(seaweed: SeaweedServer) -> Iterator[FaultProxy]:
    """A fresh fault proxy to the S3 server; faults left unapplied are simply dropped."""
    proxy = FaultProxy(seaweed.host, seaweed.port).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def s3_env(seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> SeaweedServer:
    """The S3 server, with its credentials in this process's environment for the test."""
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    return seaweed


@pytest.fixture(params=["s3", "file"])
def store_root(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Any]:
    """A writable prefix URI and its StorageConfig, on SeaweedFS and on the local store."""
    from seaweed import config_for
    from syvain_training_data.storage import StorageConfig

    if request.param == "s3":
        server = request.getfixturevalue("seaweed")
        prefix = request.getfixturevalue("unique_prefix")
        return f"s3://{TEST_BUCKET}/{prefix}", config_for(server)
    return f"file://{tmp_path}/store", StorageConfig()
