"""Fixtures of the publish tests."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def store_root(store_root: tuple[str, Any], request: pytest.FixtureRequest) -> tuple[str, Any]:
    """The shared store_root; on SeaweedFS the credentials are also in the environment, where
    pickled copies of a saver (in this process or a spawned worker) take the secret from, as
    workers do in production."""
    if store_root[0].startswith("s3://"):
        request.getfixturevalue("s3_env")
    return store_root
