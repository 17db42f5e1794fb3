"""``adopt`` and ``syvain-data adopt``: manifests for files other tools wrote, shaped like the
real corpora (FineWeb-like Parquet with several row groups in zstd and snappy, Dolma-like
jsonl.gz with blank and invalid lines), on file://, https:// and gs://; the adopted dataset
loads, mixes and resumes; odd inputs are refused naming the object."""

from __future__ import annotations

import gzip
import json
import logging
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gcs_emulator import FakeGcs, start_fake_gcs
from https_server import HttpsServer, serve_https
from resumed_reads import interrupted_and_resumed
from syvain_training_data import SyvainTrainingData
from syvain_training_data.cli import main
from syvain_training_data.errors import PublicationConflictError, ShardDataError
from syvain_training_data.publish.adopt import adopt

PER_FILE = 1200


def fineweb_like(path: Path, seed: int, compression: str) -> None:
    rng = random.Random(seed)
    table = pa.table(
        {
            "text": [
                " ".join(f"w{rng.randrange(999)}" for _ in range(40)) for _ in range(PER_FILE)
            ],
            "id": [f"<urn:uuid:{seed}-{i}>" for i in range(PER_FILE)],
            "dump": ["CC-MAIN-2024-10"] * PER_FILE,
            "language_score": [rng.random() for _ in range(PER_FILE)],
            "token_count": [rng.randrange(10, 900) for _ in range(PER_FILE)],
        }
    )
    pq.write_table(table, path, row_group_size=500, compression=compression)


def dolma_like(path: Path, seed: int) -> int:
    """A gzip file of documents with blank and one invalid line: returns its records."""
    with gzip.open(path, "wt", encoding="utf-8") as out:
        for i in range(PER_FILE):
            out.write(json.dumps({"id": f"{seed}-{i}", "text": "t" * (i % 80), "source": "cc"}))
            out.write("\n\n" if i % 300 == 0 else "\n")
        out.write("{not json\n")
    return PER_FILE


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    (root / "fineweb" / "CC-MAIN-2024-10").mkdir(parents=True)
    (root / "dolma").mkdir()
    for k in range(4):
        compression = "zstd" if k % 2 else "snappy"
        fineweb_like(
            root / "fineweb" / "CC-MAIN-2024-10" / f"{k:03d}_00000.parquet", k, compression
        )
        dolma_like(root / "dolma" / f"cc_en_{k:04d}.json.gz", k)
    return root


def as_list(batch: list[Any]) -> list[Any]:
    return batch


def test_local_parquet_and_jsonl_are_adopted_and_load_mix_and_resume(corpus, tmp_path, caplog):
    fineweb = adopt(
        [f"file://{corpus}/fineweb/"],
        data_format="parquet",
        split="train",
        out=f"file://{tmp_path}/fineweb.json",
    )
    assert [s.records for s in fineweb.splits["train"].shards] == [PER_FILE] * 4
    with caplog.at_level(logging.ERROR):
        dolma = adopt(
            [f"file://{corpus}/dolma/cc_en_*.json.gz"],
            data_format="jsonl.gz",
            split="train",
            stage="cc",
            out=f"file://{tmp_path}/dolma.json",
        )
    # Blank lines and the invalid line are not records, as the loader reads them.
    assert dolma.splits["train"].records == 4 * PER_FILE
    assert "Skipping invalid JSON record" in caplog.text
    client = SyvainTrainingData()
    for name, key in (("fineweb", "id"), ("dolma", "id")):
        uri = f"file://{tmp_path}/{name}.json"
        seen = interrupted_and_resumed(client, uri, key, seed=1, batches_before=21)
        assert len(seen) == len(set(seen)) == 4 * PER_FILE
    # Adopting again is idempotent; another manifest at the same place is refused.
    again = adopt(
        [f"file://{corpus}/fineweb/"],
        data_format="parquet",
        split="train",
        out=f"file://{tmp_path}/fineweb.json",
    )
    assert again == fineweb
    with pytest.raises(PublicationConflictError):
        adopt(
            [f"file://{corpus}/fineweb/"],
            data_format="parquet",
            split="web",
            out=f"file://{tmp_path}/fineweb.json",
        )


def test_odd_inputs_are_refused_naming_the_object(corpus, tmp_path):
    out = f"file://{tmp_path}/m.json"
    (tmp_path / "empty.parquet").write_bytes(b"")
    with pytest.raises(ValueError, match=f"{tmp_path}/empty.parquet is empty"):
        adopt([f"file://{tmp_path}/empty.parquet"], data_format="parquet", split="t", out=out)
    (tmp_path / "not.parquet").write_bytes(b"PAR1 but not really parquet")
    with pytest.raises(
        ShardDataError, match=f"Unreadable parquet shard file://{tmp_path}/not.parquet"
    ):
        adopt([f"file://{tmp_path}/not.parquet"], data_format="parquet", split="t", out=out)
    (tmp_path / "plain.jsonl.gz").write_text('{"a": 1}\n')  # not gzip
    with pytest.raises(ShardDataError, match="Unreadable jsonl.gz shard .*plain.jsonl.gz"):
        adopt([f"file://{tmp_path}/plain.jsonl.gz"], data_format="jsonl.gz", split="t", out=out)
    drifted = tmp_path / "drift.parquet"
    pq.write_table(pa.table({"text": ["a"], "other": [1]}), drifted)
    first = f"file://{corpus}/fineweb/CC-MAIN-2024-10/000_00000.parquet"
    with pytest.raises(
        ValueError, match=f"schema of file://{drifted} differs from that of {first}"
    ):
        adopt([first, f"file://{drifted}"], data_format="parquet", split="t", out=out)
    drifting = adopt(
        [first, f"file://{drifted}"],
        data_format="parquet",
        split="t",
        out=out,
        allow_schema_drift=True,
    )
    assert drifting.splits["t"].records == PER_FILE + 1
    with pytest.raises(ValueError, match="names no parquet object"):
        adopt([f"file://{tmp_path}/nothing/"], data_format="parquet", split="t", out=out)
    assert not (tmp_path / "nothing").exists()


@pytest.fixture(scope="module")
def web(corpus, tmp_path_factory) -> Iterator[HttpsServer]:
    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("adopt-tls")
        with serve_https(folder) as server:
            patch.setenv("SSL_CERT_FILE", str(folder / "ca.pem"))
            for path in corpus.rglob("*"):
                if path.is_file():
                    server.paths[f"/{path.relative_to(corpus)}"] = path.read_bytes()
            yield server


def test_files_on_a_web_server_are_adopted_from_a_list_of_urls(web, corpus, tmp_path, capsys):
    listing = tmp_path / "urls.txt"
    names = sorted(p.relative_to(corpus) for p in (corpus / "fineweb").rglob("*.parquet"))
    listing.write_text("".join(f"{web.origin}/{name}\n" for name in names))
    out = tmp_path / "web.json"
    code = main(
        [
            "adopt",
            f"@{listing}",
            "--format",
            "parquet",
            "--split",
            "train",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    assert "OK: 4 shards, 4,800 records" in capsys.readouterr().out
    # Footers only: a few ranged reads per file, never a whole download.
    fetched = [
        {name.lower(): value for name, value in h.items()}.get("range")
        for method, path, h in web.requests
        if method == "GET" and path.endswith(".parquet")
    ]
    assert fetched and all(r is not None for r in fetched)
    manifest = SyvainTrainingData().load_manifest(f"file://{out}")
    assert {s.uri.rsplit("/", 1)[1] for s in manifest.splits["train"].shards} == {
        n.name for n in names
    }


@pytest.fixture(scope="module")
def gcs(corpus) -> Iterator[tuple[FakeGcs, str]]:
    with start_fake_gcs() as server, pytest.MonkeyPatch.context() as patch:
        patch.setenv("STORAGE_EMULATOR_HOST", server.url)
        bucket = f"adopt-{uuid.uuid4().hex[:10]}"
        server.create_bucket(bucket)
        for path in corpus.rglob("*"):
            if path.is_file():
                server.upload(bucket, f"corpus/{path.relative_to(corpus)}", path.read_bytes())
        yield server, bucket


def test_a_gcs_prefix_is_adopted_and_loads(gcs, tmp_path):
    _, bucket = gcs
    manifest = adopt(
        [f"gs://{bucket}/corpus/dolma/"],
        data_format="jsonl.gz",
        split="train",
        out=f"file://{tmp_path}/gcs.json",
        jobs=2,
    )
    assert manifest.splits["train"].records == 4 * PER_FILE
    assert all(s.etag for s in manifest.splits["train"].shards)  # GCS etags are kept
    loader = SyvainTrainingData().split_data_loader(
        f"file://{tmp_path}/gcs.json", as_list, {"batch_size": 50}, allow_mixed_schemes=True
    )
    assert sum(len(batch) for batch in loader.load("train", seed=0)) == 4 * PER_FILE
