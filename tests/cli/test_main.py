"""What every command shares (`syvain_training_data.cli.main`): exit statuses, --help, one
line per failure (--debug adds the traceback), and the installed command as a real process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cli_support import Result, console_script, file_store, publish, run


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bogus"],
        ["inspect"],
        ["head", "m.json", "-n", "-1"],
        ["verify", "m.json", "--jobs", "0"],
        ["inspect", "http://host/m.json"],
        ["inspect", "s3://bucket-only"],
        ["inspect", "s3://bucket/m.json"],  # no credentials
        ["--endpoint-url", "ftp://host", "inspect", "m.json"],
    ],
)
def test_usage_errors_exit_2(argv):
    result = run(*argv)
    assert result.code == 2
    assert "Traceback" not in result.err and result.err.strip()


def test_help_exits_0():
    assert run("--help").code == 0
    assert run("verify", "--help").code == 0


def test_failures_print_one_line_and_debug_adds_the_traceback(tmp_path):
    missing = f"file://{tmp_path}/nothing/data-manifest.json"
    plain = run("inspect", missing)
    assert plain.code == 1
    assert plain.err.splitlines() == [
        f"syvain-data: error: FileNotFoundError: {plain_reason(plain)}"
    ]
    assert missing in plain.err
    debug = run("--debug", "inspect", missing)
    assert debug.code == 1
    assert debug.err.startswith("Traceback (most recent call last):")
    assert debug.err.splitlines()[-1] == plain.err.splitlines()[0]


def plain_reason(result: Result) -> str:
    return result.err.strip().split("FileNotFoundError: ", 1)[1]


def test_console_script_runs_as_a_process(tmp_path):
    manifest_uri = publish(file_store(tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    done = subprocess.run(
        [console_script(), "verify", "--deep", manifest_uri],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("OK: 4 shards, 200 records")
    failed = subprocess.run(
        [console_script(), "head", f"{manifest_uri}.missing"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert failed.returncode == 1
    assert len(failed.stderr.splitlines()) == 1 and "FileNotFoundError" in failed.stderr
    usage = subprocess.run(
        [sys.executable, "-m", "syvain_training_data", "head"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert usage.returncode == 2 and "usage: syvain-data" in usage.stderr
