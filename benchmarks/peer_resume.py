"""What the peer loaders do when a run resumes mid-epoch on another world size.

A run checkpoints after each rank has taken 10 batches on world size 2, then resumes from that
checkpoint on world size 3 (and, as a control, on world size 2 again) and reads to the end of the
epoch. Peers: mosaicml-streaming (MDS, `StreamingDataLoader.state_dict()`) and litdata
(`StreamingDataLoader.state_dict()`), each reading its own format written with zstd into a
temporary directory: 16 shards of 500 text records (an id and about 50 words), shuffled with a
fixed seed. Every rank is a real process in a gloo process group (file:// rendezvous, loopback
only), with DataLoader workers 0 and 2. The checkpoint is rank 0's state, as both peers document.

Prints one JSON line per case and a summary line. A case either names the refusal (phase,
exception type, first line of its message) or counts what the epoch delivered against the
dataset: records seen twice or more, records never seen, records delivered in total.

Run with a Python that has the peers (`scripts/peer_env.sh DIR` makes one); this script does not
import syvain_training_data:
    DIR/bin/python benchmarks/peer_resume.py [--peers mosaic litdata] [--workers 0 2]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import faulthandler
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

SHARDS = 16
RECORDS_PER_SHARD = 500
WORDS_PER_RECORD = 50
BATCH_SIZE = 8
BATCHES_BEFORE_CHECKPOINT = 10
SAVE_WORLD = 2
SEED = 17
PEERS = ("mosaic", "litdata")


def make_records() -> list[dict[str, str]]:
    """Records of equal byte length, so MDS shards can be cut at exactly 500 records."""
    rng = random.Random(SEED)
    vocabulary = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=6)) for _ in range(2000)]
    return [
        {"id": f"rec-{n:05d}", "text": " ".join(rng.choices(vocabulary, k=WORDS_PER_RECORD))}
        for n in range(SHARDS * RECORDS_PER_SHARD)
    ]


def identity(record: dict[str, str]) -> dict[str, str]:
    return record


def write_mds(records: list[dict[str, str]], root: Path) -> None:
    from streaming import MDSWriter

    columns = {"id": "str", "text": "str"}
    # MDSWriter cuts shards by bytes: measure one record's encoded size with a probe writer.
    probe = MDSWriter(out=str(root / "probe"), columns=columns)
    per_shard = probe.extra_bytes_per_shard
    per_record = len(probe.encode_sample(records[0])) + probe.extra_bytes_per_sample
    probe.finish()
    limit = per_shard + RECORDS_PER_SHARD * per_record
    with MDSWriter(
        out=str(root / "mds"), columns=columns, compression="zstd", size_limit=limit
    ) as out:
        for record in records:
            out.write(record)
    shards = json.loads((root / "mds" / "index.json").read_text())["shards"]
    assert [shard["samples"] for shard in shards] == [RECORDS_PER_SHARD] * SHARDS, shards


def write_litdata(records: list[dict[str, str]], root: Path) -> None:
    import litdata

    litdata.optimize(
        fn=identity,
        inputs=records,
        output_dir=str(root / "litdata"),
        chunk_size=RECORDS_PER_SHARD,
        num_workers=1,
        compression="zstd",
        # Whole-chunk zstd: litdata 0.2.76 cannot read back its default ("batch") framed chunks
        # (RuntimeError "... indexed as compression_level='batch' but missing LDFZ01 magic").
        compression_level="chunk",
    )
    chunks = json.loads((root / "litdata" / "index.json").read_text())["chunks"]
    assert [chunk["chunk_size"] for chunk in chunks] == [RECORDS_PER_SHARD] * SHARDS, chunks


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Keeps the peers' progress output (theirs and their writer processes') off our JSON lines."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def make_loader(peer: str, root: Path, workers: int, cache: Path) -> Any:
    if peer == "mosaic":
        from streaming import StreamingDataLoader, StreamingDataset

        dataset = StreamingDataset(
            local=str(root / "mds"), batch_size=BATCH_SIZE, shuffle=True, shuffle_seed=SEED
        )
        return StreamingDataLoader(dataset, batch_size=BATCH_SIZE, num_workers=workers)
    import litdata

    dataset = litdata.StreamingDataset(
        str(root / "litdata"), shuffle=True, seed=SEED, cache_dir=str(cache)
    )
    return litdata.StreamingDataLoader(dataset, batch_size=BATCH_SIZE, num_workers=workers)


def first_line(error: BaseException) -> dict[str, str]:
    lines = str(error).strip().splitlines()
    return {"type": type(error).__name__, "message": lines[0][:300] if lines else ""}


def rank_main(args: argparse.Namespace) -> None:
    """One rank of one phase: read (part of) the epoch, write the ids it got and rank 0's state."""
    import torch.distributed as dist

    # A rank that hangs is killed at the phase timeout: leave its stacks in its log first.
    faulthandler.dump_traceback_later(args.timeout - 20)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{args.rendezvous}",
        rank=args.rank,
        world_size=args.world,
        timeout=timedelta(seconds=args.timeout / 2),
    )
    result: dict[str, Any] = {"ids": [], "state": None, "error": None}
    try:
        loader = make_loader(args.peer, Path(args.data), args.workers, Path(args.cache))
        if args.state:
            loader.load_state_dict(json.loads(Path(args.state).read_text()))
        for batch in loader:
            result["ids"].extend(batch["id"])
            if args.batches and len(result["ids"]) >= args.batches * BATCH_SIZE:
                break
        if args.batches and args.rank == 0:
            result["state"] = loader.state_dict()
    except Exception as error:  # reported, not raised: the refusal is the measurement
        result["error"] = first_line(error)
        traceback.print_exc()
    Path(args.out).write_text(json.dumps(result, default=int))
    os._exit(0)  # skip DataLoader and process-group teardown, which can wait on peers


def run_phase(
    peer: str,
    workers: int,
    world: int,
    data: Path,
    work: Path,
    name: str,
    state: Path | None,
    batches: int,
    timeout: float,
) -> list[dict[str, Any]]:
    """Starts `world` rank processes and returns each rank's result."""
    phase = work / name
    phase.mkdir()
    procs = []
    for rank in range(world):
        env = os.environ | {
            "WORLD_SIZE": str(world),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
        }
        command = [sys.executable, __file__, "--rank-of", peer, "--rank", str(rank)]
        command += ["--world", str(world), "--rank-workers", str(workers), "--data", str(data)]
        command += ["--rendezvous", str(phase / "rendezvous"), "--cache", str(phase / "cache")]
        command += ["--out", str(phase / f"rank{rank}.json"), "--batches", str(batches)]
        command += ["--timeout", str(timeout), "--state", str(state or "")]
        with open(phase / f"rank{rank}.log", "wb") as log:
            procs.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
    results = []
    deadline = time.monotonic() + timeout
    for rank, proc in enumerate(procs):
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            proc.wait()
        out = phase / f"rank{rank}.json"
        if out.exists():
            results.append(json.loads(out.read_text()))
        else:
            if proc.returncode < 0:
                error = {"type": "timeout", "message": f"killed after {timeout:.0f} s"}
            else:
                log = (phase / f"rank{rank}.log").read_text(errors="replace").strip()
                error = {"type": f"exit {proc.returncode}", "message": log[-300:]}
            results.append({"ids": [], "state": None, "error": error})
    clean_shared_memory()
    return results


def clean_shared_memory() -> None:
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()


def refusal(phase: str, results: list[dict[str, Any]]) -> dict[str, str] | None:
    for rank, result in enumerate(results):
        if result["error"]:
            return {"phase": phase, "rank": str(rank), **result["error"]}
    return None


def run_case(
    peer: str,
    workers: int,
    resume_world: int,
    data: Path,
    saved: list[dict[str, Any]],
    work: Path,
    timeout: float,
) -> dict[str, Any]:
    start = time.perf_counter()
    case: dict[str, Any] = {
        "peer": peer,
        "workers": workers,
        "save_world": SAVE_WORLD,
        "resume_world": resume_world,
        "batches_before_checkpoint": BATCHES_BEFORE_CHECKPOINT,
        "records": SHARDS * RECORDS_PER_SHARD,
    }
    refused = refusal("save", saved)
    resumed: list[dict[str, Any]] = []
    if refused is None:
        state = work / f"{peer}-w{workers}-state.json"
        state.write_text(json.dumps(saved[0]["state"]))
        name = f"{peer}-w{workers}-resume{resume_world}"
        resumed = run_phase(peer, workers, resume_world, data, work, name, state, 0, timeout)
        refused = refusal("resume", resumed)
    case["refused"] = refused
    case["before_checkpoint_per_rank"] = [len(result["ids"]) for result in saved]
    case["after_resume_per_rank"] = [len(result["ids"]) for result in resumed]
    if refused is None:
        counts = collections.Counter(i for result in saved + resumed for i in result["ids"])
        case["delivered"] = sum(counts.values())
        case["seen_twice_or_more"] = sum(1 for n in counts.values() if n > 1)
        case["never_seen"] = SHARDS * RECORDS_PER_SHARD - len(counts)
    case["seconds"] = round(time.perf_counter() - start, 1)
    return case


def verdict(case: dict[str, Any]) -> str:
    if case["refused"]:
        return f"refused at {case['refused']['phase']}: {case['refused']['type']}"
    if case["seen_twice_or_more"] or case["never_seen"]:
        return f"{case['seen_twice_or_more']} repeated, {case['never_seen']} lost"
    return "exact"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per phase")
    parser.add_argument("--rank-of", choices=PEERS, help=argparse.SUPPRESS)
    for option in ("--rank", "--world", "--batches", "--rank-workers"):
        parser.add_argument(option, type=int, help=argparse.SUPPRESS)
    for option in ("--data", "--rendezvous", "--cache", "--out", "--state"):
        parser.add_argument(option, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_of:
        args.peer, args.workers = args.rank_of, args.rank_workers
        rank_main(args)
        return
    clean_shared_memory()
    summary = {}
    with tempfile.TemporaryDirectory() as tmp:
        data, work = Path(tmp) / "data", Path(tmp) / "work"
        work.mkdir()
        records = make_records()
        with stdout_to_stderr():
            write_mds(records, data)
            write_litdata(records, data)
        for peer in args.peers:
            for workers in args.workers:
                saved = run_phase(
                    peer,
                    workers,
                    SAVE_WORLD,
                    data,
                    work,
                    f"{peer}-w{workers}-save",
                    None,
                    BATCHES_BEFORE_CHECKPOINT,
                    args.timeout,
                )
                for resume_world in (SAVE_WORLD, 3):
                    case = run_case(peer, workers, resume_world, data, saved, work, args.timeout)
                    print(json.dumps(case), flush=True)
                    summary[f"{peer} w{workers} {SAVE_WORLD}->{resume_world}"] = verdict(case)
    print(json.dumps({"summary": summary}), flush=True)


if __name__ == "__main__":
    main()
