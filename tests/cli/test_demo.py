"""`syvain-data demo` (what `./dev demo` runs): the README's main job, on the local store and on
SeaweedFS, and again on the same root."""

from __future__ import annotations

from cli_support import run
from syvain_training_data import DataManifest


def test_demo_publishes_reads_back_and_reuses_on_a_rerun(tmp_path):
    first = run("demo", "--root", str(tmp_path), "--records", "300")
    assert first.code == 0, first.err
    out = first.out
    assert "every record read exactly once" in out and "summary: 300 records" in out
    assert "reused" not in out
    manifest = tmp_path / "datasets" / "demo" / "data-manifest-v1.json"
    published = DataManifest.model_validate_json(manifest.read_bytes())
    assert published.splits["train"].records == 240
    assert sorted(published.splits["train"].curriculum) == ["main", "warmup"]
    again = run("demo", "--root", str(tmp_path), "--records", "300")
    assert again.code == 0, again.err
    assert "reused 10 shards finished by an earlier run" in again.out
    assert manifest.read_bytes() == published.model_dump_json(indent=2).encode() + b"\n"


def test_demo_against_seaweedfs(s3_store):
    result = run("demo", "--root", s3_store.root, "--records", "100", env=s3_store.env)
    assert result.code == 0, result.err
    out = result.out
    assert (
        f"store: {s3_store.root} at http://127.0.0.1:" in out
        and "every record read exactly once" in out
    )
