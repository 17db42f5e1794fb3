"""Fixtures shared by the representation tests (one test file per module of
``syvain_training_data/representation/``), against SeaweedFS.

A complete publication is written by ``representation_fixture.PublicationBuilder`` at the
canonical path of a fresh recipe; the loader must return exactly the builder's tensors in the
specified order. Then every rule of SPEC section 7 is broken on its own, in an otherwise valid
publication, and the error type and message are checked. Every test runs with ``TMPDIR`` set
to an empty directory that must be empty again when the test ends (successes, errors and
early closes leave no temporary file).

Fixtures
--------
``temp_dir``  (autouse) the test's ``TMPDIR``, checked to be empty again at the end.
``config``    a ``StorageConfig`` for the session's SeaweedFS.
``builder``   a small ``PublicationBuilder`` (seed 7), not yet published.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from representation_fixture import PublicationBuilder
from seaweed import config_for
from syvain_training_data.storage import StorageConfig

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # for representation_helpers, also under --import-mode=importlib
    sys.path.insert(0, _HERE)

SMALL = {"basis_fit": 2, "analysis": 3, "validation": 2}


@pytest.fixture(autouse=True)
def temp_dir(seaweed, tmp_path, monkeypatch) -> Iterator[Path]:
    """TMPDIR for the test; it must be empty again at the end."""
    path = tmp_path / "tmp"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    yield path
    assert sorted(os.listdir(path)) == []


@pytest.fixture
def config(seaweed) -> StorageConfig:
    # The publication's canonical URI is on S3, so the local-store half of store_root cannot
    # serve here.
    return config_for(seaweed)


@pytest.fixture
def builder() -> PublicationBuilder:
    return PublicationBuilder(blocks_per_task=SMALL, seed=7)
