"""syvain-training-data: publish datasets to object stores and stream them into PyTorch."""

from syvain_training_data.client import SyvainTrainingData
from syvain_training_data.errors import ObjectChangedError, StorageRetryExhaustedError
from syvain_training_data.manifest import (
    DataManifest,
    DataManifestDataFormat,
    JsonObject,
    JsonValue,
    ManifestCurriculumStage,
    ManifestDatasetEntry,
    ManifestShard,
)
from syvain_training_data.storage import StorageConfig

__all__ = [
    "DataManifest",
    "DataManifestDataFormat",
    "JsonObject",
    "JsonValue",
    "ManifestCurriculumStage",
    "ManifestDatasetEntry",
    "ManifestShard",
    "ObjectChangedError",
    "StorageConfig",
    "StorageRetryExhaustedError",
    "SyvainTrainingData",
]
