"""jsonl.gz lines the reader skips (not JSON, or JSON that is not an object) are not records in
a range read either (SPEC section 3): a range that starts after one starts at its own first
record, so every range is that slice of the whole read, and a loader over several consumers
yields every record once. (Counting them as records started such a range one record early: its
predecessor was read twice and the shard's last record never.)"""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from syvain_training_data import ManifestShard, SyvainTrainingData, iter_shard

RECORDS = 400
BROKEN = {3: "{not json", 150: "[1, 2]", 151: '"a string"', 299: '{"unterminated": '}


def write_shard(path: Path) -> ManifestShard:
    with gzip.open(path, "wt", encoding="utf-8") as out:
        for i in range(RECORDS):
            out.write(json.dumps({"i": i}) + "\n")
            if i in BROKEN:
                out.write(BROKEN[i] + "\n\n")
    return ManifestShard(uri=f"file://{path}", records=RECORDS, size_bytes=path.stat().st_size)


def test_every_range_is_its_slice_of_the_whole_read(tmp_path, caplog):
    shard = write_shard(tmp_path / "part.jsonl.gz")
    with caplog.at_level(logging.ERROR):
        whole = [r["i"] for r in iter_shard("jsonl.gz", shard)]
    assert whole == list(range(RECORDS))
    assert caplog.text.count("Skipping invalid JSON record") == len(BROKEN)
    for start, stop in [(0, 4), (4, 5), (3, 152), (152, 300), (300, 400), (5, 400), (399, 400)]:
        part = [r["i"] for r in iter_shard("jsonl.gz", shard, start=start, stop=stop)]
        assert part == whole[start:stop], (start, stop)


def as_list(batch: list[Any]) -> list[Any]:
    return batch


@pytest.mark.parametrize("seed", [None, 3])
def test_several_consumers_yield_every_record_once(tmp_path, seed):
    client = SyvainTrainingData()
    shard = write_shard(tmp_path / "part.jsonl.gz")
    manifest = {
        "version": 1,
        "data_format": "jsonl.gz",
        "splits": {"train": {"records": RECORDS, "shards": [shard.model_dump()], "curriculum": {}}},
    }
    uri = (
        client.save_manifest(f"file://{tmp_path}/m.json", manifest) and f"file://{tmp_path}/m.json"
    )
    seen = []
    for rank in range(5):
        loader = client.split_data_loader(uri, as_list, {"batch_size": 9}).load(
            "train", rank=rank, world_size=5, seed=seed
        )
        seen += [r["i"] for batch in loader for r in batch]
    assert sorted(seen) == list(range(RECORDS))
