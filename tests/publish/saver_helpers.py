"""Helpers shared by the DatasetSaver tests: a saver under a store root, records, reading back."""

from __future__ import annotations

from syvain_training_data import DatasetSaver, ManifestShard
from syvain_training_data.shard import iter_shard
from syvain_training_data.storage import StorageConfig

FORMATS = ["jsonl.gz", "msgpack.zstf"]


def make_saver(root: str, config: StorageConfig, data_format: str = "msgpack.zstf") -> DatasetSaver:
    return DatasetSaver(
        f"{root}/ds/data-manifest.json", data_format=data_format, storage_config=config
    )


def records(n: int, start: int = 0) -> list[dict]:
    return [{"id": start + i, "text": f"record {start + i} é"} for i in range(n)]


def read_back(saver: DatasetSaver, shard: ManifestShard) -> list[dict]:
    return list(iter_shard(saver.data_format, shard, storage_config=saver.storage_config))
