"""jsonl.gz shards entered mid-stream (SPEC section 6, indexes): the saver and ``syvain-data
index`` write an access point per block beside each shard, and a block read through it fetches
about the block's own bytes and yields exactly the records a whole read yields there, whoever
wrote the shard (members, header fields, invalid and blank lines)."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from syvain_training_data import SyvainTrainingData, iter_shard, iter_shard_batches
from syvain_training_data.cli import main as cli_main
from syvain_training_data.formats.gzip_index import HEADER, GzipIndexLayout
from syvain_training_data.formats.shard_index import INDEX_SUFFIX
from syvain_training_data.loading.shard_indexes import ShardIndexes, index_problem
from syvain_training_data.manifest import ManifestShard
from syvain_training_data.publish.adopt import adopt
from syvain_training_data.publish.indexing import index_shard
from syvain_training_data.shard import read_records
from syvain_training_data.storage import StorageConfig

# About 1 KB of hex per record: a block (about 4 MiB of the shard) is some 8,000 records.
RECORDS = 30_000


def record(i: int) -> dict[str, object]:
    rng = random.Random(i)
    return {"i": i, "hex": rng.randbytes(rng.randrange(100, 900)).hex()}


def foreign_text() -> bytes:
    """What another writer might leave: records among blank lines, lines that are not JSON
    objects, and a record of 200 KB."""
    lines = []
    for i in range(RECORDS):
        if i % 997 == 0:
            lines.append("")
        if i % 1_499 == 0:
            lines.append("not json")
        if i == 12_345:
            lines.append(json.dumps({"i": i, "hex": "ab" * 100_000}))
            continue
        lines.append(json.dumps(record(i)))
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture(scope="module")
def foreign(tmp_path_factory) -> tuple[ManifestShard, list[dict[str, object]]]:
    """A jsonl.gz shard of three gzip members (one with a file name), adopted."""
    root = tmp_path_factory.mktemp("foreign")
    text = foreign_text()
    thirds = [text[: len(text) // 3], text[len(text) // 3 : 2 * len(text) // 3]]
    thirds.append(text[2 * len(text) // 3 :])
    path = root / "part-0.jsonl.gz"
    with path.open("wb") as out:
        out.write(gzip.compress(thirds[0], compresslevel=6, mtime=0))
        with gzip.GzipFile(filename="part.jsonl", mode="wb", fileobj=out, mtime=0) as member:
            member.write(thirds[1])
        out.write(gzip.compress(thirds[2], compresslevel=9, mtime=0))
    manifest = adopt(
        [f"file://{path}"],
        data_format="jsonl.gz",
        split="train",
        out=f"file://{root}/data-manifest.json",
    )
    shard = manifest.splits["train"].shards[0]
    whole = list(iter_shard("jsonl.gz", shard))
    assert len(whole) == shard.records == RECORDS
    return shard, whole


def test_index_writes_keeps_and_every_block_reads_exactly(foreign):
    pyarrow = pytest.importorskip("pyarrow")
    shard, whole = foreign
    config = StorageConfig()
    assert index_shard(shard, config, data_format="jsonl.gz") == "written"
    assert index_shard(shard, config, data_format="jsonl.gz") == "kept"
    layout = GzipIndexLayout(shard.records, shard.size_bytes)
    assert layout.entries >= 20
    indexes = ShardIndexes(None, None, "jsonl.gz")
    rng = random.Random(0)
    firsts = [n for n in range(RECORDS) if n % layout.block % layout.step == 0]
    assert len(firsts) == layout.entries
    ranges = list(zip(firsts, [*firsts[1:], RECORDS], strict=True))
    ranges += [tuple(sorted(rng.sample(range(RECORDS + 1), 2))) for _ in range(12)]
    for start, stop in ranges:
        if start == stop:
            continue
        segment = indexes.segment(shard, start, stop)
        assert segment is not None and segment.entry is not None
        records = list(read_records("jsonl.gz", shard, None, start, stop, segment))
        assert records == whole[start:stop], (start, stop)
        # The columnar read (columns=, load_tokens) enters the same way.
        batches = iter_shard_batches(
            "jsonl.gz", shard, columns=["i"], start=start, stop=stop, index=segment
        )
        ids = [i for batch in batches for i in pyarrow.record_batch(batch).column("i").to_pylist()]
        assert ids == [r["i"] for r in whole[start:stop]]
        # About the bytes of the steps the range touches: what is before the first step's
        # first record and after the last one's last is less than a deflate block (and the
        # one long record) each.
        steps = layout.entry_of(stop - 1) - layout.entry_of(start) + 1
        share = shard.size_bytes * min(RECORDS, steps * layout.step) / RECORDS
        assert segment.byte_end - segment.byte_start <= share + 400_000, (start, stop)
    assert index_problem(shard, config, data_format="jsonl.gz") is None


def test_verify_finds_a_tampered_entry_and_the_loader_ignores_a_stale_index(
    foreign, tmp_path, caplog
):
    shard, whole = foreign
    config = StorageConfig()
    index_shard(shard, config, data_format="jsonl.gz")
    path = Path(shard.uri.removeprefix("file://") + INDEX_SUFFIX)
    original = path.read_bytes()
    layout = GzipIndexLayout(shard.records, shard.size_bytes).with_header(original)
    try:
        tampered = bytearray(original)
        tampered[HEADER.size + layout.slot + 8] ^= 1  # access point 1's skip
        path.write_bytes(bytes(tampered))
        problem = index_problem(shard, config, data_format="jsonl.gz")
        assert problem is not None and "access point 1 " in problem
        # Another version of the shard named: not used, and the reads stay exact.
        stale = bytearray(original)
        stale[24] ^= 1
        path.write_bytes(bytes(stale))
        indexes = ShardIndexes(None, None, "jsonl.gz")
        start, stop = layout.step + 5, layout.step + 50
        assert indexes.segment(shard, start, stop) is None
        assert "another version of the shard" in caplog.text
        assert list(iter_shard("jsonl.gz", shard, start=start, stop=stop)) == whole[start:stop]
    finally:
        path.write_bytes(original)


def test_the_saver_writes_an_index_and_seeded_reads_fetch_each_byte_about_once(tmp_path):
    pytest.importorskip("torch")
    client = SyvainTrainingData()
    manifest_uri = f"file://{tmp_path}/data-manifest.json"
    saver = client.dataset_saver(manifest_uri, data_format="jsonl.gz")
    for part in range(2):
        rows = (record(i) for i in range(part * RECORDS // 2, (part + 1) * RECORDS // 2))
        shard = saver.save("train", None, rows, shard_id=f"part-{part}")
        assert Path(shard.uri.removeprefix("file://") + INDEX_SUFFIX).exists()
    saver.commit_manifest()
    manifest = client.load_manifest(manifest_uri)
    total = sum(s.size_bytes for s in manifest.splits["train"].shards)

    def seeded(world_size: int) -> tuple[list[int], int]:
        seen: list[int] = []
        fetched = 0
        for rank in range(world_size):
            loader = client.split_data_loader(manifest_uri, list, {"batch_size": 64}).load(
                "train", seed=3, rank=rank, world_size=world_size
            )
            seen += [r["i"] for batch in loader for r in batch]
            fetched += loader.stats().bytes
        return sorted(seen), fetched

    # Four blocks, each read by one consumer from its access point: not the shards' starts.
    seen, fetched = seeded(1)
    assert seen == list(range(RECORDS))
    assert fetched <= 1.05 * total, fetched / total
    # Four consumers split every block of this one-window dataset (each enters at the block's
    # access point and skips to its part); each record still once.
    seen, fetched = seeded(4)
    assert seen == list(range(RECORDS))


def test_indexes_under_another_prefix_are_read_from_there(foreign, tmp_path):
    shard, whole = foreign
    root = f"file://{tmp_path}/indexes"
    assert index_shard(shard, StorageConfig(), data_format="jsonl.gz", index_root=root) in (
        "written",
        "kept",
    )
    indexes = ShardIndexes(None, root, "jsonl.gz")
    start, stop = RECORDS // 2, RECORDS // 2 + 100
    segment = indexes.segment(shard, start, stop)
    assert segment is not None and segment.byte_start > 0
    assert list(read_records("jsonl.gz", shard, None, start, stop, segment)) == whole[start:stop]


def test_the_index_command_indexes_a_jsonl_dataset(foreign, capsys):
    shard, _ = foreign
    manifest_uri = shard.uri.rsplit("/", 1)[0] + "/data-manifest.json"
    assert cli_main(["index", manifest_uri]) == 0
    out = capsys.readouterr().out
    assert "1 shard" in out
    assert cli_main(["verify", "--deep", manifest_uri]) == 0
