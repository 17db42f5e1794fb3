"""Fixtures of the format tests (one test file per module of ``syvain_training_data/formats/``
or topic of it).

Fixtures
--------
``temp_dir``  the system temp directory, redirected to an empty directory of the test.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def temp_dir(tmp_path, monkeypatch) -> Path:
    """The system temp directory, redirected to an empty directory of this test."""
    directory = tmp_path / "system-tmp"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    return directory
