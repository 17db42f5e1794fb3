"""syvain-training-data: publish datasets to object stores and stream them into PyTorch."""

from syvain_training_data.client import SyvainTrainingData
from syvain_training_data.errors import (
    ObjectChangedError,
    PublicationConflictError,
    StorageRetryExhaustedError,
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
from syvain_training_data.saver import DatasetSaver
from syvain_training_data.storage import StorageConfig

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
    "PublicationConflictError",
    "StorageConfig",
    "StorageRetryExhaustedError",
    "SyvainTrainingData",
]
