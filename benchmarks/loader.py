"""Loader benchmark: one epoch over 16 text-record shards through `SplitDataLoader`.

batch_size 32, collate to a list, 0 and 2 workers (fork), from the local directory store and
from SeaweedFS; then, when they are importable, the same records through mosaicml-streaming
(MDS) and litdata StreamingDataset from local disk with 2 workers and with 0 (the readers
alone, without torch's worker IPC). Prints one JSON line per case and a summary with the
ratios (2 workers / 0 workers; ours / each peer at the same worker count). Best of --repeat
epochs.

Each line also gives the CPU seconds the epoch cost in the main process and in the worker
processes: with workers, torch's DataLoader pickles every batch in a worker and unpickles it in
the main process, which is where a 2-core machine loses the gain of a second worker.

Also: the same epochs through the shard-split loader this one replaced (its
``loader.py`` taken from git, --baseline-rev), time to the first batch, the checkpoint's size,
and the storage bytes fetched per epoch over the dataset's bytes at 16 consumers over 16
shards, counted by a TCP relay in front of SeaweedFS, for each format, unshuffled and seeded.

Run: .venv/bin/python benchmarks/loader.py  (build with `maturin develop --release` first)
Peers: pass --peer-python PATH to a Python that has `streaming` and `litdata` installed; they
are measured in a subprocess of this script. `scripts/peer_env.sh DIR` makes one, with the
newest litdata and `zstandard` (without it litdata's own zstd chunks fail to read back).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import random
import resource
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from seaweed import start_seaweed  # noqa: E402
from syvain_training_data import SyvainTrainingData  # noqa: E402

WORDS = [f"w{i}" for i in range(2000)] + ["the", "of", "and", "data", "model", "training"]
SHARDS = 16
BATCH = 32


def text_records(count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {"id": f"doc-{seed}-{i:07d}", "text": " ".join(rng.choice(WORDS) for _ in range(220))}
        for i in range(count)
    ]


def collate(records: list[Any]) -> list[Any]:
    return records


def publish(
    client: SyvainTrainingData,
    manifest_uri: str,
    shards: list[list[dict]],
    data_format: str = "msgpack.zstf",
) -> None:
    saver = client.dataset_saver(manifest_uri, data_format=data_format)
    for index, records in enumerate(shards):
        saver.save("train", None, records, shard_id=f"{index:05d}")
    saver.commit_manifest()


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def baseline_loader(rev: str) -> Any:
    """The SplitDataLoader class of ``rev`` (the shard-split loader), loaded from git."""
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(
        ["git", "show", f"{rev}:python/syvain_training_data/loader.py"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "baseline_loader.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("baseline_loader", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_loader"] = module
    spec.loader.exec_module(module)
    return module.SplitDataLoader


def make_loader(client: SyvainTrainingData, uri: str, workers: int, baseline: Any = None) -> Any:
    args: dict[str, Any] = {"batch_size": BATCH, "num_workers": workers}
    if workers:
        args["multiprocessing_context"] = "fork"
    if baseline is None:
        return client.split_data_loader(uri, collate, args).load("train")
    manifest = client.load_manifest(uri)
    return baseline(manifest, collate, args, storage_config=client.storage_config).load("train")


def epoch_rate(
    client: SyvainTrainingData, uri: str, workers: int, repeat: int, baseline: Any = None
) -> tuple[float, float, float]:
    """Best records/s over ``repeat`` epochs, with that epoch's main-process and worker CPU
    seconds."""
    loader = make_loader(client, uri, workers, baseline)
    best = (0.0, 0.0, 0.0)
    for _ in range(repeat):
        main_cpu = cpu_seconds(resource.RUSAGE_SELF)
        workers_cpu = cpu_seconds(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        records = sum(len(batch) for batch in loader)
        rate = records / (time.perf_counter() - start)
        if rate > best[0]:
            best = (
                rate,
                cpu_seconds(resource.RUSAGE_SELF) - main_cpu,
                cpu_seconds(resource.RUSAGE_CHILDREN) - workers_cpu,
            )
    return best


PEER_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import torch.utils.data as tud


    def collate(batch):
        return batch


    def main():
        kind, root, shard_files = sys.argv[1], sys.argv[2], sys.argv[3]
        repeat, workers = int(sys.argv[4]), int(sys.argv[5])
        names = json.load(open(shard_files))
        records = [json.loads(line) for name in names for line in open(name)]
        chunk = len(json.dumps(records)) // 16
        if kind == "mds":
            from streaming import MDSWriter, StreamingDataset
            columns = {"id": "str", "text": "str"}
            with MDSWriter(out=root + "/mds", columns=columns, compression="zstd",
                           size_limit=chunk) as out:
                for record in records:
                    out.write(record)

            def make():
                return StreamingDataset(local=root + "/mds", batch_size=32, shuffle=False)
        else:
            import litdata
            litdata.optimize(fn=convert, inputs=records,
                             output_dir=root + "/litdata", num_workers=1, chunk_bytes=chunk,
                             compression="zstd")

            def make():
                return litdata.StreamingDataset(root + "/litdata")
        best = 0.0
        for _ in range(repeat):
            fork = {"multiprocessing_context": "fork"} if workers else {}
            loader = tud.DataLoader(make(), batch_size=32, num_workers=workers,
                                    collate_fn=collate, **fork)
            start = time.perf_counter()
            count = sum(len(batch) for batch in loader)
            best = max(best, count / (time.perf_counter() - start))
        assert count == len(records), (count, len(records))
        print(json.dumps({"rate": best}))


    def convert(record):
        return record


    if __name__ == "__main__":
        main()
    """
)


def peer_rate(
    python: str, kind: str, shards: list[list[dict]], repeat: int, workers: int
) -> float | None:
    with tempfile.TemporaryDirectory() as root:
        names = []
        for index, records in enumerate(shards):
            name = f"{root}/src-{index}.jsonl"
            Path(name).write_text("".join(json.dumps(r) + "\n" for r in records))
            names.append(name)
        Path(f"{root}/files.json").write_text(json.dumps(names))
        script = Path(f"{root}/peer.py")
        script.write_text(PEER_SCRIPT)
        done = subprocess.run(
            [python, str(script), kind, root, f"{root}/files.json", str(repeat), str(workers)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            print(
                json.dumps(
                    {
                        "peer": kind,
                        "error": [line for line in done.stderr.splitlines() if "Error" in line][
                            -3:
                        ],
                    }
                )
            )
            return None
        return float(json.loads(done.stdout.strip().splitlines()[-1])["rate"])


class CountingRelay:
    """A TCP relay on 127.0.0.1 that counts the bytes the store sends through it."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.received = 0
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, target: socket.socket, count: bool) -> None:
        try:
            while data := source.recv(1 << 16):
                if count:
                    with self._lock:
                        self.received += len(data)
                target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._server.close()


def fetch_ratio(
    server: Any, manifest_uri: str, consumers: int, seed: int | None, window: int
) -> float:
    """Bytes the store sent for one epoch read by ``consumers`` ranks (one consumer each),
    over the dataset's bytes."""
    relay = CountingRelay(server.host, server.port)
    client = SyvainTrainingData(
        s3_base_url=f"http://127.0.0.1:{relay.port}",
        region=server.region,
        access_key_id=server.access_key_id,
        secret_access_key=server.secret_access_key,
    )
    loader = client.split_data_loader(manifest_uri, collate, {"batch_size": BATCH})
    dataset_bytes = sum(s.size_bytes for s in loader.manifest.splits["train"].shards)
    before = relay.received
    records = 0
    for rank in range(consumers):
        part = loader.load(
            "train", rank=rank, world_size=consumers, seed=seed, shuffle_buffer=window
        )
        records += sum(len(batch) for batch in part)
    time.sleep(0.2)  # the relay's last reads
    relay.close()
    assert records == sum(s.records for s in loader.manifest.splits["train"].shards)
    return (relay.received - before) / dataset_bytes


def first_batch_seconds(client: SyvainTrainingData, uri: str, workers: int) -> float:
    loader = make_loader(client, uri, workers)
    start = time.perf_counter()
    batches = iter(loader)
    next(batches)
    seconds = time.perf_counter() - start
    del batches
    return seconds


def checkpoint_bytes(client: SyvainTrainingData, uri: str) -> int:
    loader = client.split_data_loader(uri, collate, {"batch_size": BATCH}).load("train", seed=1)
    batches = iter(loader)
    for _ in range(10):
        next(batches)
    return len(json.dumps(loader.state_dict(), separators=(",", ":")))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records-per-shard", type=int, default=8000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--peer-python", default=None)
    parser.add_argument("--baseline-rev", default="a73f925", help="git rev of the shard split")
    options = parser.parse_args()
    shards = [text_records(options.records_per_shard, seed) for seed in range(SHARDS)]
    baseline = baseline_loader(options.baseline_rev)
    rates: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as root, start_seaweed(buckets=("bench",)) as server:
        local = SyvainTrainingData()
        s3 = SyvainTrainingData(
            s3_base_url=server.endpoint,
            region=server.region,
            access_key_id=server.access_key_id,
            secret_access_key=server.secret_access_key,
        )
        for store, client, uri in (
            ("local", local, f"file://{root}/loader/data-manifest.json"),
            ("seaweedfs", s3, "s3://bench/loader/data-manifest.json"),
        ):
            publish(client, uri, shards)
            for workers in (0, 2):
                rate, main_cpu, workers_cpu = epoch_rate(client, uri, workers, options.repeat)
                rates[f"{store}_{workers}w"] = rate
                old, _, _ = epoch_rate(client, uri, workers, options.repeat, baseline)
                rates[f"{store}_{workers}w_shard_split"] = old
                print(
                    json.dumps(
                        {
                            "store": store,
                            "workers": workers,
                            "records_per_s": round(rate),
                            "main_cpu_s": round(main_cpu, 2),
                            "workers_cpu_s": round(workers_cpu, 2),
                            "shard_split_records_per_s": round(old),
                            "first_batch_s": round(first_batch_seconds(client, uri, workers), 3),
                        }
                    ),
                    flush=True,
                )
        print(json.dumps({"checkpoint_bytes": checkpoint_bytes(s3, uri)}), flush=True)
        for data_format in ("msgpack.zstf", "parquet", "jsonl.gz"):
            uri = f"s3://bench/fetch-{data_format}/data-manifest.json"
            publish(s3, uri, shards, data_format)
            for seed, window in ((None, 0), (1, 64), (1, 1024)):
                ratio = fetch_ratio(server, uri, SHARDS, seed, window)
                line = {
                    "fetched_over_dataset_bytes": round(ratio, 3),
                    "format": data_format,
                    "consumers": SHARDS,
                    "shards": SHARDS,
                    "seed": seed,
                    "shuffle_buffer": window,
                }
                print(json.dumps(line), flush=True)
        # Shards of unequal sizes: consumer parts then start inside shards, which the
        # msgpack.zstf record offset index lets a reader enter without fetching the prefix.
        flat = [record for shard in shards for record in shard]
        cuts = sorted(random.Random(5).sample(range(1, len(flat)), SHARDS - 1))
        unequal = [flat[a:b] for a, b in zip([0, *cuts], [*cuts, len(flat)], strict=True)]
        uri = "s3://bench/fetch-unequal/data-manifest.json"
        publish(s3, uri, unequal)
        for seed, window in ((None, 0), (1, 64)):
            line = {
                "fetched_over_dataset_bytes": round(
                    fetch_ratio(server, uri, SHARDS, seed, window), 3
                ),
                "format": "msgpack.zstf",
                "consumers": SHARDS,
                "shards": f"{SHARDS} of unequal sizes",
                "seed": seed,
                "shuffle_buffer": window,
            }
            print(json.dumps(line), flush=True)
    if options.peer_python:
        for kind in ("mds", "litdata"):
            for workers in (0, 2):
                rate = peer_rate(options.peer_python, kind, shards, options.repeat, workers)
                if rate is not None:
                    rates[f"{kind}_{workers}w"] = rate
                    line = {"peer": kind, "workers": workers, "records_per_s": round(rate)}
                    print(json.dumps(line), flush=True)
    summary: dict[str, float] = {
        f"{store}_2w_over_0w": round(rates[f"{store}_2w"] / rates[f"{store}_0w"], 3)
        for store in ("local", "seaweedfs")
    }
    for store in ("local", "seaweedfs"):
        for workers in (0, 2):
            key = f"{store}_{workers}w"
            summary[f"{key}_over_shard_split"] = round(rates[key] / rates[f"{key}_shard_split"], 3)
    for kind in ("mds", "litdata"):
        for workers in (0, 2):
            if f"{kind}_{workers}w" in rates:
                summary[f"local_{workers}w_over_{kind}_{workers}w"] = round(
                    rates[f"local_{workers}w"] / rates[f"{kind}_{workers}w"], 3
                )
    print(json.dumps({"summary": summary, "records": SHARDS * options.records_per_shard}))


if __name__ == "__main__":
    main()
