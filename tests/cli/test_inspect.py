"""`syvain-data inspect`: the table of splits and stages."""

from __future__ import annotations

from cli_support import publish, run


def test_inspect_prints_splits_stages_records_bytes_and_shards(store):
    manifest_uri = publish(store)
    manifest = store.client.load_manifest(manifest_uri)
    result = run("inspect", manifest_uri, env=store.env)
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0] == f"manifest  {manifest_uri}"
    assert lines[1] == "format    msgpack.zstf"
    table = [line.split() for line in lines[lines.index("") + 1 :]]
    assert table[0] == ["split", "stage", "records", "bytes", "size", "shards"]
    train = manifest.splits["train"]
    easy = train.curriculum["easy"]
    size = sum(shard.size_bytes for shard in train.shards)
    assert table[1][:4] == ["train", "(all)", "150", f"{size:,}"] and table[1][-1] == "3"
    easy_size = sum(shard.size_bytes for shard in easy.shards)
    assert table[2][:3] == ["easy", "100", f"{easy_size:,}"] and table[2][-1] == "2"
    assert table[3][0] == "hard" and table[3][-1] == "1"
    assert table[4][:3] == ["val", "(all)", "50"]
    total = size + manifest.splits["val"].shards[0].size_bytes
    assert table[5][:3] == ["total", "200", f"{total:,}"] and table[5][-1] == "4"
