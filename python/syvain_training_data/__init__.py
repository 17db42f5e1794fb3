"""syvain-training-data: publish datasets to object stores and stream them into PyTorch."""

from typing import TYPE_CHECKING

from syvain_training_data.client import SyvainTrainingData
from syvain_training_data.errors import (
    ObjectChangedError,
    ObjectDataError,
    PublicationConflictError,
    ShardDataError,
    StorageError,
    StorageRetryExhaustedError,
    SyvainError,
)
from syvain_training_data.manifest import (
    DataManifest,
    DataManifestDataFormat,
    JsonObject,
    JsonValue,
    ManifestCurriculumStage,
    ManifestDatasetEntry,
    ManifestShard,
)
from syvain_training_data.publish import DatasetSaver
from syvain_training_data.shard import iter_shard, iter_shard_batches
from syvain_training_data.storage import StorageConfig

if TYPE_CHECKING:
    # Imported lazily at run time (``__getattr__`` below); type checkers see the real classes.
    from syvain_training_data.errors import RepresentationIntegrityError
    from syvain_training_data.loading.split_loader import SplitDataLoader
    from syvain_training_data.representation import RepresentationExample

__all__ = [
    "DataManifest",
    "DataManifestDataFormat",
    "DatasetSaver",
    "JsonObject",
    "JsonValue",
    "ManifestCurriculumStage",
    "ManifestDatasetEntry",
    "ManifestShard",
    "ObjectChangedError",
    "ObjectDataError",
    "PublicationConflictError",
    "RepresentationExample",
    "RepresentationIntegrityError",
    "ShardDataError",
    "SplitDataLoader",
    "StorageConfig",
    "StorageError",
    "StorageRetryExhaustedError",
    "SyvainError",
    "SyvainTrainingData",
    "iter_shard",
    "iter_shard_batches",
]

_LAZY = {
    "SplitDataLoader": "syvain_training_data.loading.split_loader",
    "RepresentationExample": "syvain_training_data.representation",
    "RepresentationIntegrityError": "syvain_training_data.errors",
}


def __getattr__(name: str) -> object:
    # Optional-extra names (torch, the representation extra) are imported on first use, so the
    # base install stays light.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
