"""Memory of one large create-only single PUT (`put_file`) to SeaweedFS.

Writes a file of --gib GiB (1 MiB of random bytes repeated), uploads it create-only as one PUT
(the way the saver uploads a spooled shard of up to 5 GiB) and prints one JSON line: seconds,
MiB/s, and the growth of the process's anonymous resident memory (heap) and its peak resident
file pages (the mapped spool file: page cache the kernel may drop again, not process memory).
Linux only (reads /proc/self/status).

Run: .venv/bin/python benchmarks/upload_memory.py --gib 5  (build with `maturin develop
--release` first; needs --gib free GiB twice, for the file and SeaweedFS's copy)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from seaweed import config_for, start_seaweed  # noqa: E402
from syvain_training_data import storage  # noqa: E402

MIB = 1024 * 1024


def status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


@contextlib.contextmanager
def resident_peaks(every_s: float = 0.02) -> Iterator[dict[str, int]]:
    """Samples this process's RssAnon and RssFile every ``every_s`` while the block runs; the
    dict yielded holds their peaks once it ends (RssAnon starts from its value on entry)."""
    peak = {"RssAnon": status_bytes("RssAnon"), "RssFile": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for field, value in peak.items():
                peak[field] = max(value, status_bytes(field))
            time.sleep(every_s)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gib", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root, start_seaweed(buckets=("bench",)) as server:
        source = Path(root) / "shard.bin"
        block = random.Random(0).randbytes(MIB)
        with source.open("wb") as out:
            for _ in range(args.gib * 1024):
                out.write(block)
        config = config_for(server)
        storage.list_objects("s3://bench/", storage_config=config)  # client and runtime built
        base_anon = status_bytes("RssAnon")
        with resident_peaks() as peak:
            started = time.perf_counter()
            info = storage.put_file(
                "s3://bench/shard.bin", source, storage_config=config, create_only=True
            )
            size = info.size
            seconds = time.perf_counter() - started
        print(
            json.dumps(
                {
                    "case": f"put_file create-only single PUT, {args.gib} GiB",
                    "bytes": size,
                    "seconds": round(seconds, 2),
                    "mib_per_s": round(size / MIB / seconds, 1),
                    "anon_rss_growth_mib": (peak["RssAnon"] - base_anon) // MIB,
                    "peak_file_rss_mib": peak["RssFile"] // MIB,
                }
            )
        )


if __name__ == "__main__":
    main()
