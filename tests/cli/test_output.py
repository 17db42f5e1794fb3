"""What commands print (`cli/output.py`): the progress line, and values from manifests printed
with their terminal control characters escaped, by every command and in log lines."""

from __future__ import annotations

import io
import json
import logging
import re

from cli_support import file_store, publish, run
from syvain_training_data.cli.output import EscapingFormatter, ShardProgress, printable


def test_progress_line_shows_bytes_records_and_rates():
    stream = io.StringIO()
    now = [100.0]
    progress = ShardProgress(
        stream,
        label="verify",
        total_bytes=2_000_000,
        total_records=10,
        total_shards=2,
        interval_s=1.0,
        clock=lambda: now[0],
    )
    progress.add(bytes_=1000, records=1)
    assert stream.getvalue() == ""  # not a terminal: a line every interval_s at most
    now[0] = 101.0
    progress.add(bytes_=999_000, records=4, shards=1)
    assert stream.getvalue().splitlines() == [
        "verify: 1.0 MB / 2.0 MB (50%), 5 / 10 records, 1 / 2 shards, 1.0 MB/s, 5 records/s, 1.0 s"
    ]
    now[0] = 102.0
    progress.add(bytes_=1_000_000, records=5, shards=1)
    progress.finish()
    assert stream.getvalue().splitlines()[-1] == (
        "verify: 2.0 MB / 2.0 MB (100%), 10 / 10 records, 2 / 2 shards, 1.0 MB/s, 5 records/s, "
        "2.0 s"
    )


EVIL = "\x1b[31mred\x1b]0;title\x07\r\n\u202eevil\x9b2J\x7f\u2066\x00\t"
# What may reach the terminal: printable text and the line breaks the CLI itself writes.
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def test_manifest_values_are_printed_with_control_characters_escaped(tmp_path):
    assert printable(EVIL) == (
        "\\x1b[31mred\\x1b]0;title\\x07\\r\\n\\u202eevil\\x9b2J\\x7f\\u2066\\x00\\t"
    )
    assert printable(printable(EVIL)) == printable(EVIL)
    local = file_store(tmp_path / "store")
    saved = publish(local, data_format="jsonl.gz")
    real = local.client.load_manifest(saved).splits["val"].shards[0]
    # A key may not hold ASCII control characters (no store could read it), but it may hold
    # C1 controls and bidi overrides, which must be escaped as well.
    evil_key = re.sub("[\x00-\x1f\x7f]", "", EVIL)
    evil_shard = {"uri": f"{local.root}/part{evil_key}.jsonl.gz", "records": 1, "size_bytes": 9}
    good_shard = real.model_dump()
    manifest_uri = f"{local.root}/evil.json"
    local.client.save_manifest(
        manifest_uri,
        {
            "version": 1,
            "data_format": "jsonl.gz",
            "splits": {
                f"split{EVIL}": {
                    "records": 1 + real.records,
                    "shards": [good_shard, evil_shard],
                    "curriculum": {
                        f"stage{EVIL}": {
                            "records": 1,
                            "shards": [evil_shard],
                            "metadata": {f"key{EVIL}": f"value{EVIL}", "weight": 1},
                        }
                    },
                }
            },
        },
    )
    results = {
        "inspect": run("inspect", manifest_uri),
        "verify": run("verify", manifest_uri),
        "verify --deep": run("verify", "--deep", "--progress", manifest_uri),
        "head": run("head", "-n", "1000", manifest_uri),
        "head --stage": run("head", "--stage", "nope", manifest_uri),
        "head --split": run("head", "--split", "nope", manifest_uri),
        "cp": run("cp", "--with-shards", manifest_uri, str(tmp_path / "copy") + "/"),
        "debug": run("head", "--debug", "-n", "1000", manifest_uri),
    }
    for command, result in results.items():
        for text in (result.out, result.err):
            assert not UNSAFE.findall(text), (command, text)
    shown = printable(EVIL)
    assert f"split{shown}" in results["inspect"].out
    assert f"stage{shown}" in results["inspect"].out
    assert f"available splits: split{shown}" in results["head --split"].err
    shard_name = printable(evil_key)
    # verify reports the missing shard as a problem (stdout); head fails on it (stderr).
    assert f"part{shard_name}" in results["verify"].out and results["verify"].code == 1
    assert f"part{shard_name}" in results["head"].err and results["head"].code == 1
    assert "Traceback" in results["debug"].err
    # Records are JSON lines whose control characters are JSON escapes (DEL included).
    records = [json.loads(line) for line in results["head"].out.splitlines()]
    assert len(records) == real.records


def test_log_lines_are_escaped():
    formatter = EscapingFormatter("%(levelname)s %(message)s")
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "GET %s", (EVIL,), None)
    line = formatter.format(record)
    assert "\n" not in line and not UNSAFE.findall(line)
    assert line.startswith("WARNING GET \\x1b[31mred")
