"""The gs:// and https:// stores against a plain download of the same objects, and ``adopt``
over many Parquet files.

1. **Reads**: 8 objects of 8 MB on fake-gcs-server (gs://) and on a TLS server on loopback
   (https://, ``tests/https_server.py``), read whole with ``storage.open_stream`` (the loader's
   resumable stream, the size known as a manifest gives it) beside a plain ``urllib`` GET of
   the same URL in the same run (the floor: the same server, no resume, no checks): MB/s and
   the ratio, best of --repeat.
2. **adopt**: --files Parquet files (FineWeb-like, 2 row groups each) served over https://
   (whose server counts the requests) and adopted from a list of their URLs, 8 at once:
   seconds, files per second and requests per file.

Run: .venv/bin/python benchmarks/stores.py [--repeat 3] [--files 1000]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import ssl
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from gcs_emulator import start_fake_gcs  # noqa: E402
from https_server import serve_https  # noqa: E402
from syvain_training_data.publish.adopt import adopt  # noqa: E402
from syvain_training_data.storage import open_stream  # noqa: E402

OBJECTS, OBJECT_BYTES = 8, 8 << 20


def ours(uris: list[str]) -> float:
    """Seconds to stream every object whole through the store, its size known (as the loader
    knows it from the manifest) and the read held to its first response's etag."""
    started = time.perf_counter()
    for uri in uris:
        with open_stream(uri, size_bytes=OBJECT_BYTES) as stream:
            for _ in stream:
                pass
    return time.perf_counter() - started


def plain(urls: list[str], context: ssl.SSLContext | None) -> float:
    """Seconds to GET every object with urllib, reading it in 1 MiB pieces."""
    started = time.perf_counter()
    for url in urls:
        with urllib.request.urlopen(url, context=context) as response:
            while response.read(1 << 20):
                pass
    return time.perf_counter() - started


def reads(repeat: int) -> None:
    rng = random.Random(0)
    blobs = [rng.randbytes(OBJECT_BYTES) for _ in range(OBJECTS)]
    total = OBJECTS * OBJECT_BYTES / 1e6
    with start_fake_gcs() as gcs:
        os.environ["STORAGE_EMULATOR_HOST"] = gcs.url
        gcs.create_bucket("bench")
        for k, blob in enumerate(blobs):
            gcs.upload("bench", f"o/{k}", blob)
        uris = [f"gs://bench/o/{k}" for k in range(OBJECTS)]
        urls = [
            f"{gcs.url}/download/storage/v1/b/bench/o/o%2F{k}?alt=media" for k in range(OBJECTS)
        ]
        best_ours = min(ours(uris) for _ in range(repeat))
        best_plain = min(plain(urls, None) for _ in range(repeat))
        report("gs:// (fake-gcs-server)", total, best_ours, best_plain)
    with tempfile.TemporaryDirectory() as folder, serve_https(Path(folder)) as server:
        os.environ["SSL_CERT_FILE"] = f"{folder}/ca.pem"
        for k, blob in enumerate(blobs):
            server.paths[f"/o/{k}"] = blob
        context = ssl.create_default_context(cafile=f"{folder}/ca.pem")
        urls = [f"{server.origin}/o/{k}" for k in range(OBJECTS)]
        best_ours = min(ours(urls) for _ in range(repeat))
        best_plain = min(plain(urls, context) for _ in range(repeat))
        report("https:// (Python TLS server)", total, best_ours, best_plain)


def report(case: str, megabytes: float, ours_s: float, plain_s: float) -> None:
    print(
        json.dumps(
            {
                "case": f"read whole, {case}",
                "ours_mb_per_s": round(megabytes / ours_s, 1),
                "plain_download_mb_per_s": round(megabytes / plain_s, 1),
                "ours_over_plain": round(plain_s / ours_s, 3),
            }
        ),
        flush=True,
    )


def adoption(files: int) -> None:
    rng = random.Random(1)
    with tempfile.TemporaryDirectory() as folder, serve_https(Path(folder)) as server:
        os.environ["SSL_CERT_FILE"] = f"{folder}/ca.pem"
        urls = []
        for k in range(files):
            rows = 2000
            table = pa.table(
                {
                    "text": [f"doc {k} {i} " + "w" * rng.randrange(200) for i in range(rows)],
                    "id": [f"{k}-{i}" for i in range(rows)],
                    "score": [rng.random() for _ in range(rows)],
                }
            )
            sink = io.BytesIO()
            pq.write_table(table, sink, row_group_size=1000, compression="zstd")
            server.paths[f"/fw/{k:05d}.parquet"] = sink.getvalue()
            urls.append(f"{server.origin}/fw/{k:05d}.parquet")
        listing = Path(folder) / "urls.txt"
        listing.write_text("\n".join(urls))
        server.requests.clear()
        started = time.perf_counter()
        manifest = adopt(
            [f"@{listing}"],
            data_format="parquet",
            split="train",
            out=f"file://{folder}/m.json",
            jobs=8,
        )
        seconds = time.perf_counter() - started
        assert manifest.splits["train"].records == files * 2000
        print(
            json.dumps(
                {
                    "case": f"adopt {files} Parquet files over https://",
                    "seconds": round(seconds, 2),
                    "files_per_s": round(files / seconds, 1),
                    "requests_per_file": round(len(server.requests) / files, 2),
                }
            ),
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--files", type=int, default=1000)
    options = parser.parse_args()
    reads(options.repeat)
    adoption(options.files)


if __name__ == "__main__":
    main()
