"""The typed sample program (checked by mypy --strict in ./dev lint) also runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SAMPLE = Path(__file__).resolve().parent / "typing" / "sample_program.py"


def test_sample_program_runs(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SAMPLE), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("OK: 4 shards, 310 records")
