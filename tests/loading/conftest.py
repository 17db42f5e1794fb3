"""Fixtures of the loading tests, built once per module: the record loader's staged dataset
(``loader_data``) on the local store and on SeaweedFS, and the token datasets of every format
(``token_runs``) on the local store."""

from __future__ import annotations

import uuid

import pytest

from loader_data import make_dataset, s3_client
from syvain_training_data import SyvainTrainingData
from token_runs import FORMATS, make_token_dataset


@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory) -> tuple[SyvainTrainingData, str]:
    client = SyvainTrainingData()
    root = f"file://{tmp_path_factory.mktemp('loader')}"
    return client, make_dataset(client, root)


@pytest.fixture(scope="module")
def s3_dataset(seaweed, s3_bucket) -> tuple[SyvainTrainingData, str]:
    client = s3_client(seaweed)
    return client, make_dataset(client, f"s3://{s3_bucket}/loader-{uuid.uuid4().hex}")


@pytest.fixture(params=["local", "s3"])
def dataset(request) -> tuple[SyvainTrainingData, str]:
    return request.getfixturevalue(f"{request.param}_dataset")


@pytest.fixture(scope="module")
def token_sets(tmp_path_factory):
    client = SyvainTrainingData()
    root = f"file://{tmp_path_factory.mktemp('tokens')}"
    return client, {fmt: make_token_dataset(client, root, fmt) for fmt in FORMATS}
