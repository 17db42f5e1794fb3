"""Loader benchmark: one epoch over 16 text-record shards through `SplitDataLoader`.

batch_size 32, collate to a list, 0 and 2 workers (fork), from the local directory store and
from SeaweedFS; then, when they are importable, the same records through mosaicml-streaming
(MDS) and litdata StreamingDataset from local disk with 2 workers (the issue's comparison) and
with 0 (the readers alone, without torch's worker IPC). Prints one JSON line per case and a
summary with the ratios (2 workers / 0 workers; ours / each peer at the same worker count).
Best of --repeat epochs.

Each line also gives the CPU seconds the epoch cost in the main process and in the worker
processes: with workers, torch's DataLoader pickles every batch in a worker and unpickles it in
the main process, which is where a 2-core machine loses the gain of a second worker.

Run: .venv/bin/python benchmarks/loader.py  (build with `maturin develop --release` first)
Peers: pass --peer-python PATH to a Python that has `streaming` and `litdata` installed; they
are measured in a subprocess of this script. `scripts/peer_env.sh DIR` makes one (litdata is
pinned to 0.2.60: the zstd chunks 0.2.76 writes fail its own reader, "missing LDFZ01 magic").
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import textwrap
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


def publish(client: SyvainTrainingData, manifest_uri: str, shards: list[list[dict]]) -> None:
    saver = client.dataset_saver(manifest_uri, data_format="msgpack.zstf")
    for index, records in enumerate(shards):
        saver.save("train", None, records, shard_id=f"{index:05d}")
    saver.commit_manifest()


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def epoch_rate(
    client: SyvainTrainingData, uri: str, workers: int, repeat: int
) -> tuple[float, float, float]:
    """Best records/s over ``repeat`` epochs, with that epoch's main-process and worker CPU
    seconds."""
    args: dict[str, Any] = {"batch_size": BATCH, "num_workers": workers}
    if workers:
        args["multiprocessing_context"] = "fork"
    loader = client.split_data_loader(uri, collate, args).load("train")
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records-per-shard", type=int, default=8000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--peer-python", default=None)
    options = parser.parse_args()
    shards = [text_records(options.records_per_shard, seed) for seed in range(SHARDS)]
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
                print(
                    json.dumps(
                        {
                            "store": store,
                            "workers": workers,
                            "records_per_s": round(rate),
                            "main_cpu_s": round(main_cpu, 2),
                            "workers_cpu_s": round(workers_cpu, 2),
                        }
                    ),
                    flush=True,
                )
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
    for kind in ("mds", "litdata"):
        for workers in (0, 2):
            if f"{kind}_{workers}w" in rates:
                summary[f"local_{workers}w_over_{kind}_{workers}w"] = round(
                    rates[f"local_{workers}w"] / rates[f"{kind}_{workers}w"], 3
                )
    print(json.dumps({"summary": summary, "records": SHARDS * options.records_per_shard}))


if __name__ == "__main__":
    main()
