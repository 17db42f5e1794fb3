"""Mixture schedules (``load_tokens(mixing_schedule=...)``) in loaders over a local store: ranks
crossing boundaries together, resume with an edited schedule, validation, hostile states,
state size."""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from syvain_training_data import SyvainTrainingData  # noqa: E402
from syvain_training_data.loading import (  # noqa: E402
    mixing,
    schedule,
)
from token_runs import run_ranks  # noqa: E402

# --- loaders over a local store ---------------------------------------------------------------

CODE = 1_000_000  # code token ids start here; each record is 4 tokens, one block of seq_len 4


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    client = SyvainTrainingData()
    uri = f"file://{tmp_path_factory.mktemp('schedule')}/data-manifest.json"
    saver = client.dataset_saver(uri, data_format="msgpack.zstf")
    for stage, base, weight in (("web", 0, 3), ("code", CODE, 1)):
        for shard in range(3):
            records = [
                {"tokens": list(range(base + 4 * i, base + 4 * i + 4))}
                for i in range(200 * shard, 200 * shard + 200)
            ]
            saver.save(
                "train",
                stage,
                records,
                curriculum_metadata={"weight": weight},
                shard_id=f"{stage}-{shard}",
            )
    saver.commit_manifest()
    return client, uri


SCHEDULE = [(0, {"web": 3, "code": 1}), (600, {"web": 1, "code": 3})]


def run(client, uri, ranks, workers, batch, stop_after=None, *, state=None, **load):
    """Every rank of a run with seq_len 4 (see token_runs.run_ranks). Returns the records
    (first token // 4, code ones offset) received per rank and the merged state."""
    batches, merged = run_ranks(
        client,
        uri,
        ranks,
        workers,
        batch,
        4,
        stop_after,
        state=state,
        keep=torch.Tensor.tolist,
        **load,
    )
    return [[row[0] for rows in rank for row in rows] for rank in batches], merged


def web_share(records: list[int]) -> float:
    return sum(r < CODE for r in records) / len(records)


def test_a_one_entry_schedule_is_mixing_weights(staged):
    client, uri = staged
    weights = {"web": 3, "code": 1}
    for stop in mixing.MIX_STOPS:
        by_weights, state = run(client, uri, 2, 0, 3, 5, mixing_weights=weights, mixing_stop=stop)
        one = [(0, weights)]
        by_schedule, scheduled = run(client, uri, 2, 0, 3, 5, mixing_schedule=one, mixing_stop=stop)
        assert by_schedule == by_weights
        assert "schedule" not in state and scheduled["schedule"] == [[0, [3.0, 1.0]]]
        # The mixing_weights loader keeps its selection (and fingerprint); its state resumes
        # the schedule.
        loader = client.split_data_loader(uri, None)
        by_w = loader.load_tokens("train", seq_len=4, mixing_weights=weights, mixing_stop=stop)
        by_s = loader.load_tokens("train", seq_len=4, mixing_schedule=one, mixing_stop=stop)
        assert by_w.dataset.read_plan.schedule is None
        assert by_w.dataset.read_plan == dataclasses.replace(by_s.dataset.read_plan, schedule=None)
        assert state["selection"] == by_w.dataset.fingerprint() != by_s.dataset.fingerprint()
        rest_w, _ = run(client, uri, 2, 0, 3, state=state, mixing_weights=weights, mixing_stop=stop)
        rest_s, _ = run(client, uri, 2, 0, 3, state=state, mixing_schedule=one, mixing_stop=stop)
        assert rest_s == rest_w
        later = [*one, (700, {"web": 1, "code": 1})]
        rest_l, _ = run(client, uri, 2, 0, 3, state=state, mixing_schedule=later, mixing_stop=stop)
        head = [r for rank in by_weights for r in rank]
        tail = [r for rank in rest_l for r in rank]
        assert max(Counter(head + tail).values()) == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_ranks_cross_segment_boundaries_together(staged, workers):
    client, uri = staged
    load = {"mixing_schedule": SCHEDULE, "mixing_stop": "all_exhausted"}
    received, _ = run(client, uri, 4, workers, 5, **load)
    assert sorted(r for rank in received for r in rank) == sorted(
        [*range(0, 4 * 600, 4), *range(CODE, CODE + 4 * 600, 4)]
    )
    # Each rank's first 150 records are its share of segment 0 (3:1), the next ones of
    # segment 1 (1:3); with workers, each worker's share of each (every stretch of a
    # worker's records is within 2 of its weights).
    slack = 2 * max(workers, 1)
    for records in received:
        assert abs(sum(r < CODE for r in records[:40]) - 30) <= slack
        assert abs(sum(r < CODE for r in records[:150]) - 112.5) <= slack
        assert abs(sum(r < CODE for r in records[150:]) - 37.5) <= slack
    assert abs(sum(r < CODE for r in received[0][150:250]) - 25) <= slack
    plain, _ = run(
        client, uri, 4, 0, 5, mixing_weights={"web": 3, "code": 1}, mixing_stop="all_exhausted"
    )
    assert web_share(plain[3][:40]) == 0.0  # without a schedule the last rank starts late


def positions_of(order: schedule.ScheduledOrder, start: int, stop: int) -> list[int]:
    """The records (as run() names them) at mixed positions [start, stop) of ``order``."""
    counts = order.prefix(start)
    records = []
    for s in order.labels(start, stop):
        records.append(4 * counts[s] + (CODE if s == 1 else 0))
        counts[s] += 1
    return records


@pytest.mark.parametrize("workers", [0, 2])
def test_a_schedule_edited_after_the_resume_point_resumes_exactly(staged, workers):
    client, uri = staged
    load = {"mixing_stop": "all_exhausted"}
    head, state = run(client, uri, 2, workers, 4, 10, mixing_schedule=SCHEDULE, **load)
    assert state["schedule"] == [[0, [3.0, 1.0]], [600, [1.0, 3.0]]]
    assert state["segments"] == [600, 1200]
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
    everything = [*range(0, 4 * 600, 4), *range(CODE, CODE + 4 * 600, 4)]
    assert sorted(consumed + rest) == sorted(everything)  # each record once
    # The rest follows the new schedule: from position 500 on, its records are the new
    # order's, which the old schedule would not have put there.
    new = schedule.ScheduledOrder(
        [600, 600],
        ((0, (3.0, 1.0)), (500, (1.0, 1.0)), (900, (2.0, 1.0))),
        "all_exhausted",
        None,
        0,
    )
    old = schedule.ScheduledOrder(
        [600, 600], ((0, (3.0, 1.0)), (600, (1.0, 3.0))), "all_exhausted", None, 0
    )
    assert set(positions_of(new, 500, 1200)) <= set(rest)
    assert positions_of(new, 500, 1200) != positions_of(old, 500, 1200)
    assert after["schedule"][1] == [500, [1.0, 1.0]] and after["segments"] == [600, 1200]


def test_a_schedule_edited_before_the_resume_point_is_refused(staged):
    client, uri = staged
    load = {"mixing_stop": "all_exhausted"}
    _, state = run(client, uri, 2, 0, 4, 10, mixing_schedule=SCHEDULE, **load)
    loader = client.split_data_loader(uri, None, {"batch_size": 2})
    edits = {
        r"from position 300 \(entry 1: the state's position 600 weights \[1.0, 3.0\], this "
        r"loader's position 300 weights \[1.0, 3.0\]\), at or before epoch position 339": [
            (0, {"web": 3, "code": 1}),
            (300, {"web": 1, "code": 3}),
        ],
        r"from position 0 \(entry 0: the state's position 0 weights \[3.0, 1.0\], this "
        r"loader's position 0 weights \[2.0, 1.0\]\)": [
            (0, {"web": 2, "code": 1}),
            (600, {"web": 1, "code": 3}),
        ],
        r"from position 200 \(entry 1: the state's position 600 weights \[1.0, 3.0\], this "
        r"loader's position 200 weights \[1.0, 1.0\]\)": [
            (0, {"web": 3, "code": 1}),
            (200, {"web": 1, "code": 1}),
            (600, {"web": 1, "code": 3}),
        ],
    }
    for message, edited in edits.items():
        dl = loader.load_tokens("train", seq_len=4, mixing_schedule=edited, **load)
        with pytest.raises(ValueError, match=message):
            dl.load_state_dict(state)
    # Edits after position 339 load; a weights loader's state is not a schedule's, nor the
    # reverse with other weights.
    dl = loader.load_tokens(
        "train", seq_len=4, mixing_schedule=[(0, {"web": 3, "code": 1}), (340, "metadata")], **load
    )
    dl.load_state_dict(state)
    with pytest.raises(ValueError, match="another selection"):
        loader.load_tokens(
            "train", seq_len=4, mixing_weights={"web": 3, "code": 1}, **load
        ).load_state_dict(state)


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
    assert order.length < 1200
    assert sorted(got) == sorted(positions_of(order, 0, order.length))


def test_schedule_validation_names_the_entry(staged):
    client, uri = staged
    loader = client.split_data_loader(uri, None, {"batch_size": 2})

    def load(value: Any, **more: Any) -> Any:
        return loader.load_tokens("train", seq_len=4, mixing_schedule=value, **more)

    w = {"web": 1, "code": 1}
    cases = {
        "not both": ([(0, w)], {"mixing_weights": w}),
        "must be a list": ({0: w}, {}),
        "1 to 64 entries": ([], {}),
        "1 to 64 entries, got 65": ([(i, w) for i in range(65)], {}),
        r"mixing_schedule\[0\] must start at position 0": ([(5, w)], {}),
        r"mixing_schedule\[2\] position 7 must be greater than mixing_schedule\[1\]'s 7": (
            [(0, w), (7, w), (7, w)],
            {},
        ),
        r"mixing_schedule\[1\] position must be an int, got True": ([(0, w), (True, w)], {}),
        r"mixing_schedule\[1\] position must be an int, got 2.5": ([(0, w), (2.5, w)], {}),
        r"mixing_schedule\[1\] must be a \(position, weights\) pair": ([(0, w), (1, w, 2)], {}),
        r"mixing_schedule\[1\] \(position 9\): mixing_weights must name exactly the stages": (
            [(0, w), (9, {"web": 1})],
            {},
        ),
        r"mixing_schedule\[1\] \(position 9\): Curriculum stage 'code' needs a positive": (
            [(0, w), (9, {"web": 1, "code": 0})],
            {},
        ),
        r"mixing_schedule\[0\] \(position 0\): weights must be a mapping": ([(0, [1, 1])], {}),
        "needs curriculum_stages": ([(0, "metadata")], {}),
        "bytes in a loader state, more than 2560": (
            [(k * 10**17, {"web": 1 / 3 + k, "code": 2 / 3}) for k in range(64)],
            {},
        ),
        "mixing_stop must be one of": ([(0, w)], {"mixing_stop": "never"}),
    }
    for message, (value, more) in cases.items():
        with pytest.raises(ValueError, match=message):
            load(value, **more)
    # "metadata" in a schedule: the stages' weight metadata (web 3, code 1).
    by_metadata = load([(0, "metadata"), (100, w)], curriculum_stages=["web", "code"])
    by_mapping = load([(0, {"web": 3, "code": 1}), (100, w)])
    assert [b.tolist() for b in by_metadata] == [b.tolist() for b in by_mapping]


def test_hostile_schedule_state_fields_are_named(staged):
    client, uri = staged
    load = {"mixing_schedule": SCHEDULE, "mixing_stop": "all_exhausted"}
    _, state = run(client, uri, 2, 0, 4, 3, **load)
    dl = client.split_data_loader(uri, None, {"batch_size": 2}).load_tokens(
        "train", seq_len=4, **load
    )
    big = 2**70
    bad: dict[str, tuple[str, Any]] = {
        r"schedule must be a list, got a dict": ("schedule", {}),
        r"schedule must hold at most 64 items, got 65": ("schedule", [[0, [1.0, 1.0]]] * 65),
        r"schedule must hold at least one entry": ("schedule", []),
        r"schedule\[0\]\[0\] \(position\) must be in \[0, 0\]": ("schedule", [[3, [1.0, 1.0]]]),
        r"schedule\[1\]\[0\] \(position\) must be in \[1, ": (
            "schedule",
            [[0, [1.0, 1.0]], [0, [1.0, 1.0]]],
        ),
        r"schedule\[1\]\[0\] \(position\) must be in .*an int of 71 bits": (
            "schedule",
            [[0, [1.0, 1.0]], [big, [1.0, 1.0]]],
        ),
        r"schedule\[0\]\[1\] \(weights\) must hold 2 items, got 3": (
            "schedule",
            [[0, [1.0, 1.0, 1.0]]],
        ),
        r"schedule\[0\]\[1\]\[1\] \(weight\) must be a number, got 'x'": (
            "schedule",
            [[0, [1.0, "x"]]],
        ),
        r"schedule\[0\]\[1\]\[0\] \(weight\) must be positive and finite, got -1.0": (
            "schedule",
            [[0, [-1.0, 1.0]]],
        ),
        r"schedule\[0\]\[1\]\[0\] \(weight\) is too large": ("schedule", [[0, [10**400, 1.0]]]),
        r"segments must be a list, got 5": ("segments", 5),
        r"segments must hold at least the epoch length": ("segments", []),
        r"segments must hold at most 64 items": ("segments", list(range(1, 66))),
        r"segments\[1\] must be in \[601, 1200\], got 600": ("segments", [600, 600]),
        r"segments\[0\] must be in \[0, 1200\], got an int of 71 bits": ("segments", [big]),
        r"segments\[0\] must be in \[0, 1200\], got 1201": ("segments", [1201]),
        r"segments\[0\] must be positive": ("segments", [0, 1200]),
        r"segments\[0\] must be an int, got True": ("segments", [True]),
    }
    for message, (key, value) in bad.items():
        with pytest.raises(ValueError, match=message):
            dl.load_state_dict({**state, key: value})
    for key in ("segments", "schedule"):
        missing = {k: v for k, v in state.items() if k != key}
        with pytest.raises(ValueError, match=f"{key} is missing"):
            dl.load_state_dict(missing)
    # Positions past the parts of the stored layout are refused as ever.
    with pytest.raises(ValueError, match="consumed"):
        dl.load_state_dict({**state, "segments": [10, 20]})


def test_a_64_entry_schedule_state_stays_under_4_kib(tmp_path):
    client = SyvainTrainingData()
    uri = f"file://{tmp_path}/three.json"
    saver = client.dataset_saver(uri, data_format="msgpack.zstf")
    for stage in range(3):
        base = stage * CODE
        records = [{"tokens": list(range(base + 4 * i, base + 4 * i + 4))} for i in range(2000)]
        saver.save("train", f"s{stage}", records)
    saver.commit_manifest()
    draw = random.Random(0)
    entries = [
        (90 * k, {f"s{s}": round(draw.uniform(0.1, 9.9), 2) for s in range(3)}) for k in range(64)
    ]
    load = {"mixing_schedule": entries, "mixing_stop": "all_exhausted"}
    received, state = run(client, uri, 2, 2, 3, 7, **load)
    assert len(state["schedule"]) == 64 and len(state["segments"]) == 64
    assert len(json.dumps(state, separators=(",", ":"))) < 4096
    assert len(json.dumps(state)) < 4096
    rest, _ = run(client, uri, 3, 1, 4, state=state, **load)
    got = Counter(r for rank in received + rest for r in rank)
    assert max(got.values()) == 1


def test_runs_on_one_topology_merge_in_a_scheduled_state(staged):
    client, uri = staged
    load = {"mixing_schedule": SCHEDULE, "mixing_stop": "all_exhausted"}
    first, state = run(client, uri, 2, 2, 4, 5, **load)
    second, state = run(client, uri, 2, 2, 4, 5, state=state, **load)
    assert len(state["interrupts"]) == 1 and state["segments"] == [600, 1200]
    third, _ = run(client, uri, 3, 0, 7, state=state, **load)
    got = [r for part in (first, second, third) for rank in part for r in rank]
    assert sorted(got) == sorted([*range(0, 4 * 600, 4), *range(CODE, CODE + 4 * 600, 4)])
