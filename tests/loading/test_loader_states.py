"""A checkpoint is input too: hostile and corrupt loader states are ValueErrors that
name the field, rejected before anything is computed from them, for ``load``, ``load(columns=)``,
``load_tokens`` and the per-worker dataset state; and the cap on interrupted runs counts only
topology changes."""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("torch")

from budget import line_budget  # noqa: E402
from syvain_training_data import SyvainTrainingData  # noqa: E402
from syvain_training_data.loading import plan  # noqa: E402
from syvain_training_data.loading import state as checks  # noqa: E402
from syvain_training_data.loading.tokens import merge_token_states  # noqa: E402

RECORDS = 60  # 3 shards of 20


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[SyvainTrainingData, str]:
    client = SyvainTrainingData()
    uri = f"file://{tmp_path_factory.mktemp('states')}/data-manifest.json"
    saver = client.dataset_saver(uri, data_format="msgpack.zstf")
    for shard in range(3):
        records = [
            {"id": f"{shard}-{i}", "tokens": list(range(i % 7 + 1))} for i in range(RECORDS // 3)
        ]
        saver.save("train", None, records, shard_id=f"{shard:03d}")
    saver.commit_manifest()
    return client, uri


def ids(batch: list[dict[str, Any]]) -> list[str]:
    return [record["id"] for record in batch]


def record_loader(dataset, **load: Any) -> Any:
    client, uri = dataset
    return client.split_data_loader(uri, ids, {"batch_size": 4}).load("train", **load)


def column_loader(dataset) -> Any:
    client, uri = dataset
    return client.split_data_loader(uri, None, {"batch_size": 4}).load("train", columns=["id"])


def token_loader(dataset, **load: Any) -> Any:
    client, uri = dataset
    return client.split_data_loader(uri, None, {"batch_size": 2}).load_tokens(
        "train", seq_len=4, **load
    )


def after_two_batches(loader: Any) -> dict[str, Any]:
    batches = iter(loader)
    next(batches)
    next(batches)
    return json.loads(json.dumps(loader.state_dict()))


def hostile(base: dict[str, Any], change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    state = copy.deepcopy(base)
    change(state)
    return state


def put(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda state: state.__setitem__(key, value)


def drop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda state: state.pop(key)


def entry(item: int, value: Any) -> Callable[[dict[str, Any]], None]:
    """Sets item ``item`` of the first interrupt."""
    return lambda state: state["interrupts"][0].__setitem__(item, value)


# Fields every loader state has: (what, change, the field its error names).
COMMON = [
    ("not a dict", None, "dict"),
    ("no version", drop("version"), "version"),
    ("version as a str", put("version", "2"), "version"),
    ("no selection", drop("selection"), "selection"),
    ("selection not a str", put("selection", 7), "selection"),
    ("a 1 MB selection", put("selection", "a" * 10**6), "selection"),
    ("no epoch", drop("epoch"), "epoch"),
    ("epoch as a str", put("epoch", "x"), "epoch"),
    ("epoch negative", put("epoch", -1), "epoch"),
    ("epoch 2**63", put("epoch", 2**63), "epoch"),
    ("epoch a bool", put("epoch", True), "epoch"),
    ("epoch a float", put("epoch", 1.0), "epoch"),
    ("no interrupts", drop("interrupts"), "interrupts"),
    ("interrupts a str", put("interrupts", "abc"), "interrupts"),
    ("interrupts a dict", put("interrupts", {"0": 1}), "interrupts"),
    ("an interrupt not a list", put("interrupts", ["x"]), r"interrupts\[0\]"),
    ("an interrupt of 4 items", put("interrupts", [[1, 1, 4, 0]]), r"interrupts\[0\]"),
    ("world_size 10**9", entry(0, 10**9), r"interrupts\[0\]\[0\] \(world_size\)"),
    ("world_size of 5,000 digits", entry(0, 10**5000), r"interrupts\[0\]\[0\] \(world_size\)"),
    ("world_size 0", entry(0, 0), r"interrupts\[0\]\[0\] \(world_size\)"),
    ("world_size a str", entry(0, "1"), r"interrupts\[0\]\[0\] \(world_size\)"),
    ("workers 10**6", entry(1, 10**6), r"interrupts\[0\]\[1\] \(workers\)"),
    ("workers beyond the records", entry(1, RECORDS + 1), r"interrupts\[0\]\[1\] \(workers\)"),
    ("workers a float", entry(1, 1.0), r"interrupts\[0\]\[1\] \(workers\)"),
    ("batch_size 2**30", entry(2, 2**30), r"interrupts\[0\]\[2\] \(batch_size\)"),
    ("batch_size -1", entry(2, -1), r"interrupts\[0\]\[2\] \(batch_size\)"),
    ("drop_last 2", entry(3, 2), r"interrupts\[0\]\[3\] \(drop_last\)"),
    ("drop_last a str", entry(3, "no"), r"interrupts\[0\]\[3\] \(drop_last\)"),
    (
        "2**20 ranks of 2 workers",
        lambda s: s["interrupts"][0].__setitem__(slice(0, 2), [2**20, 2]),
        r"interrupts\[0\]\[0:2\] \(world_size x workers\)",
    ),
    (
        "1,000 interrupts",
        lambda s: s.__setitem__("interrupts", s["interrupts"] * 1000),
        "interrupts must hold at most 256",
    ),
]


RECORD = [
    ("batches -5", entry(4, -5), r"interrupts\[0\]\[4\] \(batches\)"),
    ("batches 10**12", entry(4, 10**12), r"interrupts\[0\]\[4\] \(batches\)"),
    ("batches a str", entry(4, "3"), r"interrupts\[0\]\[4\] \(batches\)"),
    ("the issue's 10**9 ranks", put("interrupts", [[10**9, 1, 8, 0, 0]]), "world_size"),
    ("a kind of 1 MB", put("kind", "k" * 10**6), "kind"),
    (
        "65 runs of distinct topologies",
        put("interrupts", [[1, 1, size, 0, 0] for size in range(1, 66)]),
        "interrupts names 65 interrupted runs of distinct topologies",
    ),
    (
        "5 runs of 2**20 ranks",
        put("interrupts", [[2**20, 1, size, 0, 0] for size in range(1, 6)]),
        "interrupts names 5242880 consumers",
    ),
]


def rejected(load_state_dict: Callable[[Any], None], state: Any, field: str) -> None:
    with line_budget(), pytest.raises(ValueError, match=field) as raised:
        load_state_dict(state)
    assert len(str(raised.value)) < 400  # no hostile value echoed whole


@pytest.mark.parametrize(
    ("what", "change", "field"), COMMON + RECORD, ids=[c[0] for c in COMMON + RECORD]
)
@pytest.mark.parametrize("kind", ["records", "columns"])
def test_hostile_record_states_name_the_field(dataset, kind, what, change, field):
    make = record_loader if kind == "records" else column_loader
    base = after_two_batches(make(dataset))
    assert base["interrupts"] == [[1, 1, 4, 0, 2]]
    state = [base] if change is None else hostile(base, change)
    loader = make(dataset)
    rejected(loader.load_state_dict, state, field)
    # Still usable, from the start of epoch 0.
    assert sum(len(b["id"] if isinstance(b, dict) else b) for b in loader) == RECORDS


def worker_state(dataset) -> dict[str, Any]:
    loader = record_loader(dataset)
    batches = iter(loader)
    next(batches)
    return json.loads(json.dumps(loader.dataset.state_dict()))


WORKER = [
    ("yielded -5", put("yielded", -5), "yielded"),
    ("yielded 10**12", put("yielded", 10**12), "yielded"),
    ("yielded a str", put("yielded", "4"), "yielded"),
    ("no yielded", drop("yielded"), "yielded"),
    ("started 1", put("started", 1), "started"),
    ("no started", drop("started"), "started"),
    ("the issue's 10**9 ranks", put("interrupts", [[10**9, 1, 8, 0, 0]]), "world_size"),
]


@pytest.mark.parametrize(
    ("what", "change", "field"), COMMON + WORKER, ids=[c[0] for c in COMMON + WORKER]
)
def test_hostile_worker_states_name_the_field(dataset, what, change, field):
    """torchdata's per-worker state (``loader.dataset.load_state_dict``)."""
    base = worker_state(dataset)
    assert base["started"] and base["yielded"] == 4 and base["interrupts"] == []
    base["interrupts"] = [[1, 1, 4, 0, 2]]  # as after a resume
    state = [base] if change is None else hostile(base, change)
    rejected(record_loader(dataset).dataset.load_state_dict, state, field)


def test_a_worker_state_resumes_after_the_checks(dataset):
    loader = record_loader(dataset)
    batches = iter(loader)
    head = next(batches) + next(batches)
    state = json.loads(json.dumps(loader.dataset.state_dict()))
    again = record_loader(dataset)
    again.dataset.load_state_dict(state)
    rest = [record["id"] for record in again.dataset]
    assert Counter(head + rest) == Counter(f"{s}-{i}" for s in range(3) for i in range(20))


def rank_item(item: int, value: Any) -> Callable[[dict[str, Any]], None]:
    """Sets item ``item`` of rank 0's entry in the first interrupt."""
    return lambda state: state["interrupts"][0][4][0].__setitem__(item, value)


TOKEN = [
    ("world 10**12", entry(0, 10**12), r"interrupts\[0\]\[0\] \(world_size\)"),
    ("ranks not a list", entry(4, "x"), r"interrupts\[0\]\[4\] must be a list"),
    (
        "more ranks than the world",
        lambda s: s["interrupts"][0].__setitem__(4, s["interrupts"][0][4] * 5),
        r"interrupts\[0\]\[4\] must hold at most 1",
    ),
    ("a rank entry of 4 items", rank_item(slice(4, 5), []), r"interrupts\[0\]\[4\]\[0\]"),
    ("rank 7 of 1", rank_item(0, 7), r"interrupts\[0\]\[4\]\[0\]\[0\] \(rank\)"),
    ("turn 3 of 1 worker", rank_item(1, 3), r"interrupts\[0\]\[4\]\[0\]\[1\] \(turn\)"),
    ("finished 5", rank_item(2, 5), r"interrupts\[0\]\[4\]\[0\]\[2\] \(finished\)"),
    ("records -5", rank_item(3, -5), r"interrupts\[0\]\[4\]\[0\]\[3\] \(records\)"),
    ("records 10**12", rank_item(3, 10**12), r"interrupts\[0\]\[4\]\[0\]\[3\] \(records\)"),
    ("offset -1", rank_item(4, -1), r"interrupts\[0\]\[4\]\[0\]\[4\] \(token offset\)"),
    ("offset a str", rank_item(4, "1"), r"interrupts\[0\]\[4\]\[0\]\[4\] \(token offset\)"),
    (
        "2**20 ranks, one given",
        entry(0, 2**20),
        r"lacks the positions of rank\(s\) 1, 2, 3, 4, 5, 6, 7, 8 \.\.\. of 1048576 "
        r"\(interrupts\[0\]\[4\]\)",
    ),
    (
        "65 runs of distinct topologies",
        lambda s: s.__setitem__(
            "interrupts",
            [[1, 1, size, 0, [[0, 0, 0, 0, 0]]] for size in range(1, 66)],
        ),
        "interrupts names 65 interrupted runs of distinct topologies",
    ),
]


TOKEN_CASES = [c for c in COMMON if c[0] not in ("version as a str", "no version")] + TOKEN


@pytest.mark.parametrize(("what", "change", "field"), TOKEN_CASES, ids=[c[0] for c in TOKEN_CASES])
def test_hostile_token_states_name_the_field(dataset, what, change, field):
    base = after_two_batches(token_loader(dataset))
    assert base["interrupts"][0][:4] == [1, 1, 2, 0] and len(base["interrupts"][0][4]) == 1
    state = [base] if change is None else hostile(base, change)
    if what == "not a dict":
        field = "Not a token loader state"
    loader = token_loader(dataset)
    rejected(loader.load_state_dict, state, field)
    assert sum(b.numel() for b in loader) > 0  # still usable


@pytest.mark.parametrize(
    "change",
    [put("version", "2"), drop("version"), put("kind", "records"), put("kind", "k" * 10**6)],
)
def test_token_states_of_another_kind_are_refused(dataset, change):
    base = after_two_batches(token_loader(dataset))
    rejected(token_loader(dataset).load_state_dict, hostile(base, change), "Not a token loader")


def test_token_positions_past_their_part_are_refused_at_load(dataset):
    """Positions that fit their bounds but not the plan (tokens of a record after the last of
    the part): a ValueError from load_state_dict, not later from a worker."""
    base = after_two_batches(token_loader(dataset))
    state = hostile(base, rank_item(3, RECORDS))
    state["interrupts"][0][4][0][4] = 1
    with pytest.raises(ValueError, match="consumed 60 records of a part of 60"):
        token_loader(dataset).load_state_dict(state)


@pytest.mark.parametrize(
    ("states", "field"),
    [
        ([{"interrupts": "x"}], r"states\[0\] is not a token loader state"),
        ([["x"]], r"states\[0\] is not a token loader state"),
        ([{"interrupts": [[1, 1, 2, 0]]}], r"states\[0\] interrupts\[-1\]"),
        ([{"interrupts": [[1, 1, 2, 0, [["a"]]]]}], r"\[0\]\[0\] \(rank\)"),
        ([{"interrupts": [[1, 1, 2, 0, [[]]]]}], r"interrupts\[-1\]\[4\]\[0\] is empty"),
    ],
)
def test_merge_token_states_refuses_malformed_states(states, field):
    with line_budget(), pytest.raises(ValueError, match=field):
        merge_token_states(states)


@pytest.mark.parametrize(
    "interrupts",
    [
        [[2**20, 1, 8, 0, 0]],  # 2^20 ranks: what the 10^9 is bounded to
        [[2**20, 1, size, 0, 1] for size in range(1, 5)],  # 2^22 consumers over 4 runs
        [[1, RECORDS, 1, 0, 1], [3, RECORDS // 3, 1, 1, 2]],  # as many workers as records
    ],
)
def test_states_at_the_bounds_load_in_bounded_work(dataset, interrupts):
    """A state at the bounds is accepted, and what it costs follows the split's records, not
    the ranks it names: earlier runs are laid out for their ranks that hold records only, and
    a rank has no more workers than records."""
    base = after_two_batches(record_loader(dataset))
    loader = record_loader(dataset)
    with line_budget():
        loader.load_state_dict({**base, "interrupts": interrupts})
    received = [i for batch in loader for i in batch]
    assert len(received) == len(set(received)) and set(received) <= {
        f"{s}-{i}" for s in range(3) for i in range(RECORDS // 3)
    }


# --- the cap counts topology changes only --------------------------------------------------


def test_the_cap_counts_topology_changes_only(dataset):
    """64 runs of distinct topologies load and save; resuming the last on its own topology
    keeps saving (the runs merge); a 65th topology is refused on save and on load."""
    sixty_three = [[1, 1, size, 0, 0] for size in range(5, 68)]  # batch sizes 5..67
    base = after_two_batches(record_loader(dataset))
    state = {**base, "interrupts": sixty_three}
    loader = record_loader(dataset)
    loader.load_state_dict(state)
    batches = iter(loader)
    next(batches)
    saved = loader.state_dict()  # the 64th: this loader's batch size, 4
    assert len(saved["interrupts"]) == 64 and saved["interrupts"][-1] == [1, 1, 4, 0, 1]
    for _ in range(3):  # the same topology again and again: one entry
        loader = record_loader(dataset)
        loader.load_state_dict(saved)
        batches = iter(loader)
        next(batches)
        saved = loader.state_dict()
    assert len(saved["interrupts"]) == 64 and saved["interrupts"][-1] == [1, 1, 4, 0, 4]
    assert len(json.dumps(saved)) < 4096
    client, uri = dataset
    other = client.split_data_loader(uri, ids, {"batch_size": 3}).load("train")
    other.load_state_dict(saved)
    batches = iter(other)
    next(batches)
    with pytest.raises(RuntimeError, match="65 interrupted runs of distinct topologies"):
        other.state_dict()
    sixty_five = {**saved, "interrupts": [*saved["interrupts"], [1, 1, 3, 0, 1]]}
    with pytest.raises(ValueError, match="65 interrupted runs of distinct topologies"):
        record_loader(dataset).load_state_dict(sixty_five)


def test_states_of_earlier_versions_merge_only_their_tail(dataset):
    """States saved before runs merged hold an entry per run. Runs on one topology at their
    end merge when loaded (no run was laid out after them yet); earlier ones stay as they
    were, since a later run was laid out after them entry by entry."""
    base = after_two_batches(record_loader(dataset))
    same = [[1, 1, 4, 0, 0]] * 99 + [[1, 1, 4, 0, 3]]  # 100 runs of one topology: the old cap
    loader = record_loader(dataset)
    loader.load_state_dict({**base, "interrupts": same})
    assert loader.state_dict()["interrupts"] == [[1, 1, 4, 0, 3]]
    middle = [[2, 1, 3, 0, 1], [2, 1, 3, 0, 1], [1, 1, 4, 0, 1], [1, 1, 4, 0, 1]]
    loader = record_loader(dataset)
    loader.load_state_dict({**base, "interrupts": middle})
    assert loader.state_dict()["interrupts"] == [*middle[:2], [1, 1, 4, 0, 2]]
    assert plan.merged_tail([plan.Interrupt.from_json(i) for i in middle]) == tuple(
        plan.Interrupt.from_json(i) for i in [*middle[:2], [1, 1, 4, 0, 2]]
    )


def test_a_state_at_every_bound_fits_4_kib(dataset):
    """A record loader's real ``state_dict()`` at the bounds a loader can reach fits SPEC's 4
    KiB as JSON: epoch 2^63 - 1, 64 runs (the cap) of distinct topologies, each resumed from
    the last one's state, with ranks summing to the state's 2^22 consumers and batch sizes near
    2^24. The runs stop before their first batch (a rank of so many holds one record at most);
    with every run's batches widened to 2^63 - 1 the state fits too."""
    client, uri = dataset
    # 38 runs of 100,000 ranks and 26 of 10,000: 4,060,000 consumers of 2^22 = 4,194,304.
    worlds = [100_000] * 38 + [10_000] * 26
    assert sum(worlds) <= checks.MAX_STATE_CONSUMERS and len(worlds) == checks.MAX_RUNS
    state: dict[str, Any] | None = None
    for k, world_size in enumerate(worlds):
        batch_size = checks.MAX_BATCH_SIZE - k
        loader = client.split_data_loader(uri, ids, {"batch_size": batch_size}).load(
            "train", rank=world_size - 1, world_size=world_size
        )
        if state is None:
            loader.set_epoch(checks.MAX_COUNT)
        else:
            loader.load_state_dict(state)
        batches = iter(loader)
        state = json.loads(json.dumps(loader.state_dict()))
        del batches
    assert state is not None
    assert state["epoch"] == checks.MAX_COUNT
    assert state["interrupts"] == [
        [w, 1, checks.MAX_BATCH_SIZE - k, 0, 0] for k, w in enumerate(worlds)
    ]
    record_loader(dataset).load_state_dict(state)  # a state a loader accepts
    assert len(json.dumps(state, separators=(",", ":"))) <= 4096
    assert len(json.dumps(state)) <= 4096  # as json.dumps writes it by default
    widened = {**state, "interrupts": [[*i[:4], checks.MAX_COUNT] for i in state["interrupts"]]}
    assert len(json.dumps(widened)) <= 4096
