"""Helpers of the CLI tests: run a command line in-process, and publish, tamper with and list
the small test dataset (four msgpack.zstf shards: train has two stages, val none)."""

from __future__ import annotations

import io
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from syvain_training_data import SyvainTrainingData, storage
from syvain_training_data.cli import main
from syvain_training_data.storage import StorageConfig

RECORDS_PER_SHARD = 50
# (split, stage, shard id) of the test dataset: train has two stages, val none.
LAYOUT = [
    ("train", "easy", "train-0"),
    ("train", "easy", "train-1"),
    ("train", "hard", "train-2"),
    ("val", None, "val-0"),
]


@dataclass
class Result:
    code: int
    out: str
    err: str


def run(*argv: str, env: Mapping[str, str] | None = None) -> Result:
    """Runs ``syvain-data ARGV`` in-process with ``env`` as its whole environment."""
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), environ=dict(env or {}), stdout=out, stderr=err)
    return Result(code, out.getvalue(), err.getvalue())


def records_of(shard_id: str, blob: bool = True) -> list[dict[str, Any]]:
    """Records of one test shard; ``blob`` adds a bytes field (not in JSON shards)."""
    return [
        {"id": f"{shard_id}/{i}", "text": f"record {i} of {shard_id}"}
        | ({"blob": bytes([i, 255])} if blob else {})
        for i in range(RECORDS_PER_SHARD)
    ]


@dataclass
class Store:
    """Where a test dataset lives, and the AWS variables a command needs to reach it."""

    kind: str
    root: str  # URI prefix, no trailing slash
    env: dict[str, str]
    config: StorageConfig

    @property
    def client(self) -> SyvainTrainingData:
        return SyvainTrainingData.from_env(self.env)


def seaweed_store(seaweed: Any, root: str) -> Store:
    env = seaweed.env()
    return Store("s3", root, env, SyvainTrainingData.from_env(env).storage_config)


def file_store(path: Path) -> Store:
    return Store("file", f"file://{path}", {}, StorageConfig())


def publish(store: Store, name: str = "dataset", data_format: Any = "msgpack.zstf") -> str:
    manifest_uri = f"{store.root}/{name}/data-manifest.json"
    saver = store.client.dataset_saver(manifest_uri, data_format=data_format)
    for split, stage, shard_id in LAYOUT:
        saver.save(split, stage, records_of(shard_id, data_format != "jsonl.gz"), shard_id=shard_id)
    saver.commit_manifest()
    return manifest_uri


def tamper(store: Store, manifest_uri: str, edit: Any) -> None:
    """Rewrites the manifest after ``edit`` changed its JSON document in place."""
    document = store.client.load_manifest(manifest_uri).model_dump()
    edit(document)
    storage.delete_object(manifest_uri, storage_config=store.config)
    store.client.save_manifest(manifest_uri, document)


def every_shard_list(document: dict[str, Any]) -> list[list[dict[str, Any]]]:
    lists = []
    for entry in document["splits"].values():
        lists.append(entry["shards"])
        lists += [stage["shards"] for stage in entry["curriculum"].values()]
    return lists


def set_etags(store: Store, manifest_uri: str, etag: str, shard_uri: str | None = None) -> None:
    """Rewrites the manifest with ``etag`` on the shard ``shard_uri`` (every shard if None)."""

    def edit(document: dict[str, Any]) -> None:
        for shards in every_shard_list(document):
            for shard in shards:
                if shard_uri is None or shard["uri"] == shard_uri:
                    shard["etag"] = etag

    tamper(store, manifest_uri, edit)


def console_script() -> str:
    script = shutil.which("syvain-data", path=str(Path(sys.executable).parent))
    assert script is not None, "the syvain-data console script is not installed (./dev setup)"
    return script
