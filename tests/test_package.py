"""The package root exports exactly the names of SPEC section 1, and the base import stays light
(no numpy, torch, pyarrow or safetensors until a feature that needs them is used)."""

from __future__ import annotations

import subprocess
import sys

import syvain_training_data

SPEC_EXPORTS = {
    "DataManifest",
    "DataManifestDataFormat",
    "JsonObject",
    "JsonValue",
    "ManifestCurriculumStage",
    "ManifestDatasetEntry",
    "ManifestShard",
    "DatasetSaver",
    "PublicationConflictError",
    "SplitDataLoader",
    "RepresentationExample",
    "RepresentationIntegrityError",
    "SyvainTrainingData",
    "iter_shard",
}
HEAVY = ("numpy", "torch", "pyarrow", "safetensors")


def test_every_spec_name_is_exported():
    assert set(syvain_training_data.__all__) >= SPEC_EXPORTS
    for name in syvain_training_data.__all__:
        assert getattr(syvain_training_data, name) is not None, name


def test_base_import_is_light_and_optional_names_load_lazily():
    code = (
        "import sys, syvain_training_data as p\n"
        f"heavy = {HEAVY!r}\n"
        "loaded = [m for m in heavy if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "from syvain_training_data import RepresentationIntegrityError, iter_shard\n"
        "assert issubclass(RepresentationIntegrityError, RuntimeError)\n"
        "assert not [m for m in heavy if m in sys.modules]\n"
        "from syvain_training_data import RepresentationExample\n"
        "assert RepresentationExample.__module__.startswith('syvain_training_data.')\n"
        "assert 'torch' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
