"""What the loading tests share: a client of the test S3 server, datasets published shard by
shard into split ``train`` (and the record loader's staged one), and topologies to draw."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from hypothesis import strategies as st

from syvain_training_data import SyvainTrainingData
from syvain_training_data.loading import plan


def s3_client(server: Any, endpoint: str | None = None) -> SyvainTrainingData:
    """A client of ``server`` (or of ``endpoint``, a proxy in front of it), with its
    credentials."""
    return SyvainTrainingData(
        s3_base_url=endpoint or server.endpoint,
        region=server.region,
        access_key_id=server.access_key_id,
        secret_access_key=server.secret_access_key,
    )


def publish_shards(
    client: SyvainTrainingData,
    manifest_uri: str,
    data_format: str,
    shards: Iterable[Iterable[Mapping[str, Any]]],
    id_digits: int = 3,
) -> str:
    """Each of ``shards`` saved as a shard of split train (shard ids 000, 001, ...), the
    manifest committed; returns ``manifest_uri``."""
    saver = client.dataset_saver(manifest_uri, data_format=data_format)
    for shard, records in enumerate(shards):
        saver.save("train", None, records, shard_id=f"{shard:0{id_digits}d}")
    saver.commit_manifest()
    return manifest_uri


SHARD_RECORDS = [5, 9, 3, 7, 4, 6, 8]  # 42 records in 7 shards
ALL_TRAIN = [(s, i) for s, count in enumerate(SHARD_RECORDS) for i in range(count)]


def as_list(batch: list[Any]) -> list[Any]:
    return batch


def make_dataset(client: SyvainTrainingData, root: str) -> str:
    """Seven shards in split train (stages easy = 0, 1, 2 and hard = 2, 3, 4, overlapping on
    shard 2), and split val; returns the manifest URI."""
    saver = client.dataset_saver(
        f"{root}/shards-src/data-manifest.json", data_format="msgpack.zstf"
    )
    shards = [
        saver.save(
            "train",
            None,
            [{"shard": index, "i": i} for i in range(count)],
            shard_id=f"{index:03d}",
        )
        for index, count in enumerate(SHARD_RECORDS)
    ]
    val = saver.save("val", None, [{"shard": 99, "i": 0}], shard_id="val")

    def stage(indexes: list[int]) -> dict[str, Any]:
        picked = [shards[i] for i in indexes]
        return {
            "records": sum(s.records for s in picked),
            "shards": [s.model_dump() for s in picked],
        }

    manifest_uri = f"{root}/data-manifest.json"
    client.save_manifest(
        manifest_uri,
        {
            "version": 1,
            "data_format": "msgpack.zstf",
            "splits": {
                "train": {
                    "records": sum(SHARD_RECORDS),
                    "shards": [s.model_dump() for s in shards],
                    "curriculum": {"hard": stage([2, 3, 4]), "easy": stage([0, 1, 2])},
                },
                "val": {"records": 1, "shards": [val.model_dump()]},
            },
        },
    )
    return manifest_uri


def keys(batches) -> list[tuple[int, int]]:
    return [(record["shard"], record["i"]) for batch in batches for record in batch]


def records_of(batches) -> list[Any]:
    return [record for batch in batches for record in batch]


def topologies(world_size: int, workers: int, batch_size: int) -> st.SearchStrategy[plan.Topology]:
    """Loader topologies of at most these ranks, workers per rank and batch size."""
    return st.builds(
        plan.Topology,
        world_size=st.integers(1, world_size),
        workers=st.integers(1, workers),
        batch_size=st.integers(1, batch_size),
        drop_last=st.booleans(),
    )


def run_python(*lines: str) -> None:
    """Runs ``lines`` as a program in a fresh interpreter (nothing imported yet); a failed
    assertion there fails the test."""
    subprocess.run([sys.executable, "-c", "\n".join(lines)], check=True)
