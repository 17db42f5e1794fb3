"""A user program over the whole public API, checked by ``mypy --strict`` in ``./dev lint``
(so the package's annotations and the extension's stubs are what a user's type checker sees)
and run by ``tests/test_typing.py``.

Usage: ``python tests/typing/sample_program.py DIRECTORY`` publishes, reads, streams and copies
a small dataset in the local directory store under DIRECTORY.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from syvain_training_data import (
    DataManifest,
    DataManifestDataFormat,
    DatasetSaver,
    JsonObject,
    JsonValue,
    ManifestCurriculumStage,
    ManifestDatasetEntry,
    ManifestShard,
    ObjectChangedError,
    PublicationConflictError,
    RepresentationExample,
    RepresentationIntegrityError,
    SplitDataLoader,
    StorageConfig,
    StorageRetryExhaustedError,
    SyvainTrainingData,
    iter_shard,
    storage,
)
from syvain_training_data.cli import main as cli_main
from syvain_training_data.manifest import canonical_manifest_bytes, parse_manifest
from syvain_training_data.storage import ObjectInfo, ObjectStream


def documents(part: int, count: int) -> Iterator[dict[str, JsonValue]]:
    for index in range(count):
        yield {"id": f"{part}-{index}", "text": "lorem ipsum", "label": index % 2}


def publish(client: SyvainTrainingData, root: str, data_format: DataManifestDataFormat) -> str:
    manifest_uri = f"{root}/{data_format}/data-manifest.json"
    saver: DatasetSaver = client.dataset_saver(manifest_uri, data_format=data_format)
    metadata: JsonObject = {"difficulty": "easy"}
    with ThreadPoolExecutor(max_workers=2) as pool:
        shards: list[ManifestShard] = list(
            pool.map(
                lambda part: saver.save(
                    "train",
                    "easy",
                    documents(part, 100),
                    curriculum_metadata=metadata,
                    shard_id=f"part-{part}",
                ),
                range(3),
            )
        )
    saver.register_curriculum("train", "easy", shards, curriculum_metadata=metadata)
    saver.save("val", None, documents(9, 10), shard_id="val-0")
    recovered: ManifestShard | None = saver.recover("val", None, shard_id="val-0")
    assert recovered is not None
    manifest: DataManifest = saver.commit_manifest()
    entry: ManifestDatasetEntry = manifest.splits["train"]
    stage: ManifestCurriculumStage = entry.curriculum["easy"]
    assert stage.records == entry.records == 300
    return manifest_uri


def read(client: SyvainTrainingData, manifest_uri: str) -> int:
    manifest = client.load_manifest(manifest_uri)
    config: StorageConfig = client.storage_config
    total = 0
    for shard in manifest.splits["train"].shards:
        for record in iter_shard(manifest.data_format, shard, storage_config=config):
            text: Any = record["text"]
            total += len(str(text))
    return total


def stream_bytes(manifest: DataManifest, config: StorageConfig) -> int:
    shard = manifest.splits["val"].shards[0]
    info: ObjectInfo = storage.head_object(shard.uri, storage_config=config)
    stream: ObjectStream
    with storage.open_stream(shard.uri, size_bytes=info.size, etag=info.etag) as stream:
        return sum(len(chunk) for chunk in stream)


def collate(records: list[Mapping[str, Any]]) -> list[str]:
    return [str(record["id"]) for record in records]


def load(client: SyvainTrainingData, manifest_uri: str) -> int:
    loader: SplitDataLoader = client.split_data_loader(manifest_uri, collate, {"batch_size": 16})
    batches = 0
    for batch in loader.load("train", curriculum_stages=["easy"]):
        batches += len(batch) > 0
    return batches


def handle_errors(client: SyvainTrainingData, uri: str) -> str:
    try:
        client.load_manifest(uri)
    except FileNotFoundError:
        return "missing"
    except (PublicationConflictError, ObjectChangedError, StorageRetryExhaustedError) as error:
        return type(error).__name__
    return "found"


def projection_shapes(examples: Iterator[RepresentationExample]) -> list[tuple[int, ...]]:
    return [tuple(example.teacher_final_state_projections.shape) for example in examples]


def representation_arguments(client: SyvainTrainingData) -> str:
    """The representation loader checks its arguments at the call, before any I/O."""
    try:
        examples = client.iter_representation_examples(
            "s3://syvain-data/elsewhere/data-manifest-v1.json",
            "0" * 64,
            split="analysis",
            sources=["dolmino"],
            per_source_count=1,
            teacher_layer=15,
            state_kind="post_mlp",
        )
    except ValueError:
        return "rejected"
    except RepresentationIntegrityError as error:
        return str(error)
    return str(len(projection_shapes(examples)))


def main(directory: str) -> int:
    client = SyvainTrainingData()
    root = f"file://{directory}"
    manifest_uri = publish(client, root, "msgpack.zstf")
    publish(client, root, "jsonl.gz")
    manifest = client.load_manifest(manifest_uri)
    assert parse_manifest(canonical_manifest_bytes(manifest), manifest_uri) == manifest
    assert read(client, manifest_uri) == 300 * len("lorem ipsum")
    assert stream_bytes(manifest, client.storage_config) > 0
    assert load(client, manifest_uri) == 19  # 300 records in batches of 16
    assert handle_errors(client, f"{root}/nothing.json") == "missing"
    assert representation_arguments(client) == "rejected"
    status: int = cli_main(["verify", "--deep", "--no-progress", manifest_uri])
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
