"""Smoke test of an installed wheel (base install: pydantic only), run from outside the checkout.

``scripts/check_wheel.sh`` runs it in fresh Python 3.12 and 3.13 environments with no Rust
toolchain on PATH, and cibuildwheel runs it on every wheel it builds (``[tool.cibuildwheel]``
in pyproject.toml). It writes a dataset with the saver in msgpack.zstf and jsonl.gz to a local
directory store, reads every record back with ``iter_shard``, and runs the installed
``syvain-data`` command on it. Exit status 0 when everything holds.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import syvain_training_data
from syvain_training_data import SyvainTrainingData, _native, iter_shard


def check_installed() -> None:
    package = Path(syvain_training_data.__file__).resolve()
    native = Path(_native.__file__).resolve()
    prefix = Path(sys.prefix).resolve()
    assert prefix in package.parents, f"imported from {package}, not from the environment"
    assert prefix in native.parents, f"extension loaded from {native}"
    for extra in ("torch", "numpy", "pyarrow", "safetensors"):
        assert importlib.util.find_spec(extra) is None, f"{extra} came with the base install"
    print(f"installed: {package.parent} ({native.name})")


def round_trip(root: Path) -> str:
    client = SyvainTrainingData()
    uri = ""
    for data_format in ("msgpack.zstf", "jsonl.gz"):
        uri = f"{root.as_uri()}/{data_format}/data-manifest.json"
        saver = client.dataset_saver(uri, data_format=data_format)
        expected = {}
        for part in range(3):
            records = [
                {"id": f"{part}-{i}", "text": "smoke é ✓", "values": [i, i / 2, None, True]}
                for i in range(500)
            ]
            stage = "hard" if part == 2 else "easy"
            shard = saver.save("train", stage, records, shard_id=f"part-{part}")
            expected[shard.uri] = records
        manifest = saver.commit_manifest()
        assert client.load_manifest(uri) == manifest
        for shard in manifest.splits["train"].shards:
            assert list(iter_shard(data_format, shard)) == expected[shard.uri], shard.uri
        print(f"{data_format}: wrote and read back {manifest.splits['train'].records} records")
    return uri


def run_command(manifest_uri: str) -> None:
    script = shutil.which("syvain-data", path=str(Path(sys.executable).parent))
    assert script is not None, "the syvain-data console script is not installed"
    done = subprocess.run(
        [script, "verify", "--deep", "--no-progress", manifest_uri],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    print(f"syvain-data verify --deep: {done.stdout.strip()}")
    done = subprocess.run(
        [sys.executable, "-m", "syvain_training_data", "inspect", manifest_uri],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 and "1,500" in done.stdout, done.stdout + done.stderr


def main() -> int:
    print(f"Python {sys.version.split()[0]} at {sys.executable}")
    check_installed()
    with tempfile.TemporaryDirectory(prefix="syvain-smoke-") as directory:
        run_command(round_trip(Path(directory)))
    print("wheel smoke test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
