"""Shard codec benchmark: `iter_shard` and the native encoders beside the C-library floor.

Prints one JSON line per case. Every ratio compares figures measured in this run on the same
bytes (best of --repeat runs each, interleaved), so machine noise cancels out as far as it can.

Decoding: records/s of `iter_shard` from the local directory store and from SeaweedFS, and the
floor on the same shard bytes held in memory:
  msgpack.zstf  a Python loop of zstandard decompress + msgspec.msgpack.decode per frame
  jsonl.gz      zlib.decompress of the whole body + orjson.loads per line
(both consumed lazily, record by record, as `iter_shard` is; keeping every record alive would
make the floor pay allocator and garbage-collector costs that a streaming reader does not)
  parquet       pyarrow.parquet.read_table + Table.to_pylist
Encoding: records/s of `ShardEncoder` (and the Parquet writer) against msgspec/orjson +
zstandard level 3 / zlib level 6, the levels of SPEC section 3 (pyarrow for Parquet), same
records.

Run: .venv/bin/python benchmarks/iter_shard.py  (build with `maturin develop --release` first)
"""

from __future__ import annotations

import argparse
import io
import json
import random
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from seaweed import start_seaweed  # noqa: E402
from syvain_training_data import ManifestShard, _native, storage  # noqa: E402
from syvain_training_data.shard import iter_shard  # noqa: E402
from syvain_training_data.storage import StorageConfig  # noqa: E402

WORDS = [f"w{i}" for i in range(2000)] + ["the", "of", "and", "data", "model", "training"]


def text_records(count: int) -> list[dict[str, Any]]:
    rng = random.Random(1)
    return [
        {
            "id": f"doc-{i:09d}",
            "text": " ".join(rng.choice(WORDS) for _ in range(220)),
            "tokens": [rng.randrange(50_000) for _ in range(256)],
            "meta": {"source": "bench", "lang": "en", "score": rng.random()},
        }
        for i in range(count)
    ]


def small_records(count: int) -> list[dict[str, Any]]:
    rng = random.Random(2)
    return [
        {"id": i, "label": rng.randrange(10), "weight": rng.random(), "name": f"n{i}"}
        for i in range(count)
    ]


def best_rates(
    records: int, runs: dict[str, Callable[[], object]], repeat: int
) -> dict[str, float]:
    """Records/s of each run, best of ``repeat``, the runs taking turns so that a burst of load
    from elsewhere on the machine hits all of them alike."""
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeat):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - started)
    return {name: records / seconds for name, seconds in best.items()}


def encode_native(data_format: str, records: list[dict[str, Any]]) -> bytes:
    if data_format == "parquet":
        from syvain_training_data.formats.parquet import write_parquet_shard

        sink = io.BytesIO()
        write_parquet_shard(records, sink)
        return sink.getvalue()
    encoder = _native.ShardEncoder(data_format)
    pieces = [encoder.encode(records[i : i + 1024]) for i in range(0, len(records), 1024)]
    pieces.append(encoder.finish())
    return b"".join(pieces)


def encode_floor(data_format: str, records: list[dict[str, Any]]) -> bytes:
    if data_format == "msgpack.zstf":
        compressor = zstandard.ZstdCompressor(level=3, write_content_size=True)
        encode = msgspec.msgpack.Encoder().encode
        out = bytearray()
        for record in records:
            frame = compressor.compress(encode(record))
            out += struct.pack(">Q", len(frame))
            out += frame
        return bytes(out)
    if data_format == "jsonl.gz":
        body = b"".join(orjson.dumps(r) + b"\n" for r in records)
        gzip = zlib.compressobj(6, zlib.DEFLATED, 31)
        return gzip.compress(body) + gzip.flush()
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(records), sink, compression="zstd")
    return sink.getvalue()


def decode_floor(data_format: str, data: bytes) -> Callable[[], Iterable[Any]]:
    """The floor's records, produced lazily like `iter_shard` and dropped as they are counted:
    holding every record would slow the floor down with allocator and GC work ours avoids."""
    if data_format == "msgpack.zstf":
        decompressor = zstandard.ZstdDecompressor()
        decode = msgspec.msgpack.Decoder().decode

        def run() -> Iterator[Any]:
            view = memoryview(data)
            offset = 0
            while offset < len(view):
                (length,) = struct.unpack_from(">Q", view, offset)
                offset += 8
                yield decode(decompressor.decompress(view[offset : offset + length]))
                offset += length

        return run
    if data_format == "jsonl.gz":

        def run() -> Iterator[Any]:
            body = zlib.decompress(data, 31)
            return (orjson.loads(line) for line in body.split(b"\n") if line)

        return run

    def run() -> Iterator[Any]:
        # to_pylist builds every row at once: that is the pyarrow way this floor measures.
        return iter(pq.read_table(io.BytesIO(data)).to_pylist())

    return run


def consume(records: Iterable[object]) -> int:
    count = 0
    for _ in records:
        count += 1
    return count


def tail_case(
    shape: str,
    data_format: str,
    shards: dict[str, tuple[ManifestShard, StorageConfig]],
    repeat: int,
) -> dict[str, object]:
    """Reading the last 10% of a shard with ``start=`` (earlier records skipped undecoded;
    Parquet's rows are still decoded and dropped) against reading the whole shard: seconds of
    each and the speed-up."""
    figures: dict[str, object] = {"case": "tail 10%", "shape": shape, "format": data_format}
    for source, (shard, config) in shards.items():
        start = shard.records - shard.records // 10
        tail = shard.records - start
        runs: dict[str, Callable[[], object]] = {
            "tail": lambda s=shard, c=config, a=start: consume(
                iter_shard(data_format, s, storage_config=c, start=a)
            ),
            "all": lambda s=shard, c=config: consume(iter_shard(data_format, s, storage_config=c)),
        }
        assert consume(iter_shard(data_format, shard, storage_config=config, start=start)) == tail
        # best_rates divides a count by seconds: a count of 1 gives runs per second.
        per_second = best_rates(1, runs, repeat)
        figures[f"{source}_tail_s"] = round(1 / per_second["tail"], 4)
        figures[f"{source}_all_s"] = round(1 / per_second["all"], 4)
        figures[f"{source}_speedup"] = round(per_second["tail"] / per_second["all"], 2)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--text-records", type=int, default=20_000)
    parser.add_argument("--small-records", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--formats", default="msgpack.zstf,jsonl.gz,parquet")
    args = parser.parse_args()
    shapes = {
        "text": text_records(args.text_records),
        "small": small_records(args.small_records),
    }
    root = Path(tempfile.mkdtemp(prefix="syvain-bench-"))
    with start_seaweed(buckets=("bench",)) as server:
        s3 = StorageConfig.create(
            s3_base_url=server.endpoint,
            region=server.region,
            access_key_id=server.access_key_id,
            secret_access_key=server.secret_access_key,
        )
        for shape, records in shapes.items():
            for data_format in args.formats.split(","):
                n = len(records)
                encode_rates = best_rates(
                    n,
                    {
                        "ours": lambda f=data_format, r=records: encode_native(f, r),
                        "floor": lambda f=data_format, r=records: encode_floor(f, r),
                    },
                    args.repeat,
                )
                ours_encode, floor_encode = encode_rates["ours"], encode_rates["floor"]
                print(
                    json.dumps(
                        {
                            "case": "encode",
                            "shape": shape,
                            "format": data_format,
                            "records": n,
                            "ours_records_per_s": round(ours_encode),
                            "floor_records_per_s": round(floor_encode),
                            "ratio": round(ours_encode / floor_encode, 3),
                        }
                    ),
                    flush=True,
                )
                data = encode_native(data_format, records)
                shards = {}
                for source, base, config in (
                    ("local", f"file://{root}", StorageConfig()),
                    ("seaweedfs", "s3://bench", s3),
                ):
                    uri = f"{base}/{shape}.{data_format}"
                    info = storage.put_object(uri, data, storage_config=config)
                    shards[source] = (
                        ManifestShard(uri=uri, records=n, size_bytes=info.size, etag=info.etag),
                        config,
                    )
                floor = decode_floor(data_format, data)
                assert consume(floor()) == n
                runs: dict[str, Callable[[], object]] = {"floor": lambda f=floor: consume(f())}
                for source, (shard, config) in shards.items():
                    assert consume(iter_shard(data_format, shard, storage_config=config)) == n
                    runs[source] = lambda s=shard, c=config, f=data_format: consume(
                        iter_shard(f, s, storage_config=c)
                    )
                rates = best_rates(n, runs, args.repeat)
                print(
                    json.dumps(
                        {
                            "case": "decode",
                            "shape": shape,
                            "format": data_format,
                            "records": n,
                            "shard_bytes": len(data),
                            "local_records_per_s": round(rates["local"]),
                            "seaweedfs_records_per_s": round(rates["seaweedfs"]),
                            "floor_records_per_s": round(rates["floor"]),
                            "ratio_local": round(rates["local"] / rates["floor"], 3),
                            "ratio_seaweedfs": round(rates["seaweedfs"] / rates["floor"], 3),
                        }
                    ),
                    flush=True,
                )
                print(json.dumps(tail_case(shape, data_format, shards, args.repeat)), flush=True)


if __name__ == "__main__":
    main()
