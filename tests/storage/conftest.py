"""Fixtures of the storage tests (the shared ones are in tests/conftest.py)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from syvain_training_data.storage import native_storage


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No AWS_* variable but AWS_EC2_METADATA_DISABLED, and no cached native client."""
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    native_storage.cache_clear()
    yield
    native_storage.cache_clear()


@pytest.fixture
def save_three_parts() -> Callable[[Any, str], None]:
    """Saves and commits a msgpack.zstf dataset of three shards of five records (ids
    "part-i") at a manifest URI with a SyvainTrainingData client."""

    def save(client: Any, uri: str) -> None:
        saver = client.dataset_saver(uri, data_format="msgpack.zstf")
        for part in range(3):
            records = [{"id": f"{part}-{i}"} for i in range(5)]
            saver.save("train", None, records, shard_id=f"part-{part}")
        saver.commit_manifest()

    return save
