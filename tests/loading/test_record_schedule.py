"""Mixture schedules on the record loader (``load(mixing_schedule=...)``), the rules of
``load_tokens``' (the same plan code): a one-entry schedule is ``mixing_weights``; ranks and
workers cross segment boundaries together; resume on any topology, with a schedule edited after
what the state consumed, yields every record once; an edit before it is refused naming the
difference; ``equal_batches`` and ``columns=`` keep their meaning."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from syvain_training_data import SyvainTrainingData  # noqa: E402
from syvain_training_data.loading import schedule  # noqa: E402

PER_STAGE = 600
SCHEDULE = [(0, {"web": 3, "code": 1}), (600, {"web": 1, "code": 3})]
STAGES = ["web", "code"]


def as_list(batch: list[Any]) -> list[Any]:
    return batch


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> tuple[SyvainTrainingData, str]:
    client = SyvainTrainingData()
    uri = f"file://{tmp_path_factory.mktemp('record-schedule')}/data-manifest.json"
    saver = client.dataset_saver(uri, data_format="msgpack.zstf")
    for stage in STAGES:
        for shard in range(3):
            records = [{"stage": stage, "i": i} for i in range(200 * shard, 200 * shard + 200)]
            saver.save("train", stage, records, shard_id=f"{stage}-{shard}")
    saver.commit_manifest()
    return client, uri


def key(record: dict[str, Any]) -> tuple[str, int]:
    return record["stage"], record["i"]


def run(
    client: SyvainTrainingData,
    uri: str,
    ranks: int,
    workers: int,
    batch: int,
    stop_after: int | None = None,
    *,
    state: dict[str, Any] | None = None,
    **load: Any,
) -> tuple[list[list[tuple[str, int]]], dict[str, Any]]:
    """Every rank of a run, each resuming ``state`` (through JSON) and taking ``stop_after``
    batches (None: all): the records per rank, and rank 0's state after it."""
    args: dict[str, Any] = {"batch_size": batch, "num_workers": workers}
    if workers:
        args["multiprocessing_context"] = "fork"
    load.setdefault("curriculum_stages", STAGES)
    received, states = [], []
    for rank in range(ranks):
        loader = client.split_data_loader(uri, as_list, args).load(
            "train", rank=rank, world_size=ranks, **load
        )
        if state is not None:
            loader.load_state_dict(json.loads(json.dumps(state)))
        records: list[tuple[str, int]] = []
        for taken, batch in enumerate(loader):
            records += map(key, batch)
            if stop_after is not None and taken + 1 == stop_after:
                break
        states.append(loader.state_dict())
        received.append(records)
    return received, states[0]


EVERY = sorted((stage, i) for stage in STAGES for i in range(PER_STAGE))


def web(records: list[tuple[str, int]]) -> int:
    return sum(stage == "web" for stage, _ in records)


def test_a_one_entry_schedule_is_mixing_weights(staged):
    client, uri = staged
    weights = {"web": 3, "code": 1}
    for stop in ("first_exhausted", "all_exhausted"):
        by_weights, state = run(client, uri, 2, 0, 3, 5, mixing_weights=weights, mixing_stop=stop)
        one = [(0, weights)]
        by_schedule, scheduled = run(client, uri, 2, 0, 3, 5, mixing_schedule=one, mixing_stop=stop)
        assert by_schedule == by_weights
        assert "schedule" not in state and scheduled["schedule"] == [[0, [3.0, 1.0]]]
        # The weights loader's state resumes the schedule, and the rest is the same.
        rest_w, _ = run(client, uri, 2, 0, 3, state=state, mixing_weights=weights, mixing_stop=stop)
        rest_s, _ = run(client, uri, 2, 0, 3, state=state, mixing_schedule=one, mixing_stop=stop)
        assert rest_s == rest_w
        head = [r for rank in by_weights for r in rank]
        assert max(Counter(head + [r for rank in rest_s for r in rank]).values()) == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_ranks_cross_segment_boundaries_together(staged, workers):
    client, uri = staged
    load = {"mixing_schedule": SCHEDULE, "mixing_stop": "all_exhausted", "seed": 3}
    received, _ = run(client, uri, 4, workers, 5, **load)
    assert sorted(r for rank in received for r in rank) == EVERY
    # Each rank's first 150 records are its share of segment 0 (3:1), the rest of segment 1
    # (1:3); with workers, each worker's share of each.
    slack = 2 * max(workers, 1)
    for records in received:
        assert abs(web(records[:40]) - 30) <= slack
        assert abs(web(records[:150]) - 112.5) <= slack
        assert abs(web(records[150:]) - 37.5) <= slack


@pytest.mark.parametrize(
    "before,after", [((1, 2, 50), (3, 0, 7)), ((2, 1, 9), (1, 2, 4)), ((3, 2, 4), (3, 2, 4))]
)
def test_resume_on_another_topology_yields_every_record_once(staged, before, after):
    client, uri = staged
    load = {"mixing_schedule": SCHEDULE, "mixing_stop": "all_exhausted", "seed": 5}
    head, state = run(client, uri, *before, 6, **load)
    assert state["segments"] == [600, 1200]
    tail, _ = run(client, uri, *after, state=state, **load)
    assert sorted([r for rank in head + tail for r in rank]) == EVERY


def test_same_topology_resume_is_the_uninterrupted_stream(staged):
    client, uri = staged
    load = {"mixing_schedule": SCHEDULE, "seed": 2}
    whole, _ = run(client, uri, 1, 2, 8, **load)
    head, state = run(client, uri, 1, 2, 8, 11, **load)
    tail, _ = run(client, uri, 1, 2, 8, state=state, **load)
    assert head[0] + tail[0] == whole[0]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_schedule_edited_after_the_resume_point_resumes_exactly(staged, workers):
    client, uri = staged
    load = {"mixing_stop": "all_exhausted"}
    head, state = run(client, uri, 2, workers, 4, 10, mixing_schedule=SCHEDULE, **load)
    assert state["schedule"] == [[0, [3.0, 1.0]], [600, [1.0, 3.0]]]
    # Consumed: rank 0 from position 0, rank 1 from 300 (its share of segment 0): 40 each.
    edited = [
        (0, {"web": 3, "code": 1}),
        (500, {"web": 1, "code": 1}),
        (900, {"web": 2, "code": 1}),
    ]
    tail, after = run(client, uri, 3, 1, 5, state=state, mixing_schedule=edited, **load)
    consumed = [r for rank in head for r in rank]
    rest = [r for rank in tail for r in rank]
    assert len(consumed) == 80
    assert sorted(consumed + rest) == EVERY  # each record once
    # Rank 0 finished the epoch: its state is the next epoch's, laid out by the new schedule.
    assert after["epoch"] == 1 and after["interrupts"] == []
    assert after["schedule"][1] == [500, [1.0, 1.0]] and after["segments"] == [500, 900, 1200]


def test_a_schedule_edited_before_the_resume_point_is_refused(staged):
    client, uri = staged
    load = {"mixing_stop": "all_exhausted", "curriculum_stages": STAGES}
    _, state = run(client, uri, 2, 0, 4, 10, mixing_schedule=SCHEDULE, **load)
    loader = client.split_data_loader(uri, as_list, {"batch_size": 2})
    early = [(0, {"web": 3, "code": 1}), (300, {"web": 1, "code": 3})]
    refused = loader.load("train", mixing_schedule=early, **load)
    message = (
        r"from position 300 \(entry 1: the state's position 600 weights \[1.0, 3.0\], this "
        r"loader's position 300 weights \[1.0, 3.0\]\), at or before epoch position 339"
    )
    with pytest.raises(ValueError, match=message):
        refused.load_state_dict(state)
    after_it = [(0, {"web": 3, "code": 1}), (340, {"web": 1, "code": 3})]
    later = loader.load("train", mixing_schedule=after_it, **load)
    later.load_state_dict(state)
    with pytest.raises(ValueError, match="another selection"):
        loader.load("train", mixing_weights={"web": 1, "code": 1}, **load).load_state_dict(state)


def test_a_shorter_edited_order_clips_the_layout(staged):
    client, uri = staged
    # first_exhausted: weights 1:1 then web-heavy; the edit makes web run out sooner.
    first = [(0, {"web": 1, "code": 1}), (400, {"web": 1, "code": 1})]
    head, state = run(client, uri, 2, 0, 4, 5, mixing_schedule=first)
    assert state["segments"][0] == 400
    edited = [(0, {"web": 1, "code": 1}), (400, {"web": 9, "code": 1})]
    tail, _ = run(client, uri, 1, 2, 4, state=state, mixing_schedule=edited)
    got = Counter([r for rank in head + tail for r in rank])
    assert max(got.values()) == 1
    order = schedule.ScheduledOrder(
        [600, 600], ((0, (1.0, 1.0)), (400, (9.0, 1.0))), "first_exhausted", None, 0
    )
    assert len(got) == order.length < 1200


def test_equal_batches_gives_every_rank_the_same_batches_in_each_segment(staged):
    client, uri = staged
    load = {"mixing_schedule": SCHEDULE, "mixing_stop": "all_exhausted", "equal_batches": True}
    received, _ = run(client, uri, 7, 0, 5, **load)
    assert len({len(records) for records in received}) == 1
    everything = [r for rank in received for r in rank]
    assert len(set(everything)) == len(everything)
    assert 1200 - len(everything) < 7 * 2  # fewer than world_size per segment left out
    loader = client.split_data_loader(uri, as_list, {"batch_size": 5}).load(
        "train", curriculum_stages=STAGES, rank=0, world_size=7, **load
    )
    assert len(loader) == len(received[0]) // 5 + (len(received[0]) % 5 > 0)


def test_columns_loader_follows_the_schedule_and_resumes(staged):
    client, uri = staged
    loader = client.split_data_loader(uri, None, {"batch_size": 8}).load(
        "train", curriculum_stages=STAGES, mixing_schedule=SCHEDULE, columns=["i", "stage"]
    )
    batches = iter(loader)
    head = []
    for _ in range(20):
        batch = next(batches)
        head += [(s, int(i)) for s, i in zip(batch["stage"], batch["i"], strict=True)]
    assert web(head) == 120  # 160 records of segment 0 (3:1)
    state = loader.state_dict()
    del batches
    rest_loader = client.split_data_loader(uri, as_list, {"batch_size": 3}).load(
        "train", curriculum_stages=STAGES, mixing_schedule=SCHEDULE
    )
    rest_loader.load_state_dict(json.loads(json.dumps(state)))
    rest = [key(r) for batch in rest_loader for r in batch]
    assert max(Counter(head + rest).values()) == 1
    assert len(head + rest) == len(list(Counter(head + rest)))


def test_hostile_schedule_state_fields_are_named(staged):
    client, uri = staged
    _, state = run(client, uri, 2, 0, 4, 3, mixing_schedule=SCHEDULE)
    loader = client.split_data_loader(uri, as_list, {"batch_size": 4})
    cases = {
        "schedule is missing": {k: v for k, v in state.items() if k != "schedule"},
        "segments": {**state, "segments": [10**30]},
        "schedule": {**state, "schedule": "x"},
    }
    for message, hostile in cases.items():
        fresh = loader.load("train", curriculum_stages=STAGES, mixing_schedule=SCHEDULE)
        with pytest.raises(ValueError, match=message):
            fresh.load_state_dict(hostile)
