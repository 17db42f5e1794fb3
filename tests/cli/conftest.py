"""Fixtures of the CLI tests (one test file per command, plus ``test_main`` for what every
command shares, ``test_context`` for credentials and URIs, ``test_output`` for what they print).

Fixtures
--------
``store``     a ``cli_support.Store`` on each of the stores of ``store_root`` (SeaweedFS with its
              AWS variables, and the local directory store with none).
``s3_store``  a ``Store`` on SeaweedFS only, at a fresh prefix.
"""

from __future__ import annotations

import pytest

from cli_support import Store, seaweed_store
from syvain_training_data.storage import StorageConfig


@pytest.fixture
def store(request: pytest.FixtureRequest, store_root: tuple[str, StorageConfig]) -> Store:
    root, config = store_root
    if root.startswith("s3://"):
        return Store("s3", root, request.getfixturevalue("seaweed").env(), config)
    return Store("file", root, {}, config)


@pytest.fixture
def s3_store(seaweed, s3_bucket: str, unique_prefix: str) -> Store:
    return seaweed_store(seaweed, f"s3://{s3_bucket}/{unique_prefix}")
