"""The epoch plan alone (no torch, no I/O): properties over random selections and topologies."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from syvain_training_data.loading import plan

counts_strategy = st.lists(st.integers(1, 60), min_size=1, max_size=12)
topology_strategy = st.builds(
    plan.Topology,
    world_size=st.integers(1, 128),
    workers=st.integers(1, 17),
    batch_size=st.integers(1, 64),
    drop_last=st.booleans(),
)


# Resume chains recompute each consumer's part alone, as a worker does: smaller topologies.
small_topology = st.builds(
    plan.Topology,
    world_size=st.integers(1, 12),
    workers=st.integers(1, 5),
    batch_size=st.integers(1, 16),
    drop_last=st.booleans(),
)


def epoch_positions(selection: plan.Selection, epoch: int) -> list[tuple[int, int]]:
    """Every position of the epoch as (shard, record), in epoch order (single stream)."""
    order = selection.orders(epoch)[0]
    base = [(shard, r) for shard, a, b in order.segments(0, order.total) for r in range(a, b)]
    if not order.window:
        return base
    out, position = [], 0
    while position < order.total:
        first, last = order.window_span(position)
        out += [base[first + offset] for offset in order.window_permutation(first, last)]
        position = last
    return out


def consumers(
    selection: plan.Selection, total: int, topology: plan.Topology
) -> list[list[tuple[int, int]]]:
    layout = plan.run_layout(selection, total, (), topology)
    return [part for rank in sorted(layout) for part in layout[rank]]


def positions(intervals: list[tuple[int, int]]) -> list[int]:
    return [p for start, stop in intervals for p in range(start, stop)]


@settings(max_examples=120, deadline=None)
@given(counts=counts_strategy, topology=topology_strategy, equal=st.booleans())
def test_parts_are_disjoint_complete_balanced_and_in_epoch_order(counts, topology, equal):
    selection = plan.Selection(streams=(tuple(counts),), equal_batches=equal)
    total = sum(counts)
    parts = consumers(selection, total, topology)
    flat = [p for part in parts for p in positions(part)]
    # Rank-major, worker-minor concatenation is the epoch order itself: no topology changes it.
    kept = total - total % topology.world_size if equal else total
    assert flat == list(range(kept))
    rank_sizes = [
        sum(len(positions(parts[r * topology.workers + w])) for w in range(topology.workers))
        for r in range(topology.world_size)
    ]
    assert max(rank_sizes) - min(rank_sizes) <= (0 if equal else 1)
    for rank in range(topology.world_size):
        sizes = [
            len(positions(parts[rank * topology.workers + w])) for w in range(topology.workers)
        ]
        assert max(sizes) - min(sizes) <= 1
    if equal:
        batches = {
            plan.rank_batches(selection, total, (), topology, r) for r in range(topology.world_size)
        }
        assert len(batches) == 1


@settings(max_examples=100, deadline=None)
@given(counts=counts_strategy, seed=st.integers(0, 2**32), window=st.integers(0, 40))
def test_the_epoch_order_is_a_permutation_fixed_by_seed_and_epoch(counts, seed, window):
    selection = plan.Selection(streams=(tuple(counts),), seed=seed, window=window)
    every = sorted((s, r) for s, n in enumerate(counts) for r in range(n))
    first = epoch_positions(selection, 0)
    assert sorted(first) == every
    assert epoch_positions(selection, 0) == first
    order = selection.orders(0)[0]
    if order.window:  # windows never straddle a shard
        for position in range(order.total):
            first_record, last_record = order.window_span(position)
            shards = {s for s, _, _ in order.segments(first_record, last_record)}
            assert len(shards) == 1 and last_record - first_record <= window


@settings(max_examples=300, deadline=None)
@given(
    counts=counts_strategy,
    runs=st.lists(st.tuples(small_topology, st.integers(0, 40)), min_size=1, max_size=4),
    repeat=st.booleans(),
    last=small_topology,
    equal=st.booleans(),
)
def test_resume_chains_yield_the_rest_exactly_once(counts, runs, last, equal, repeat):
    """Interrupted runs of any topologies, then a last run to the end: every position of the
    epoch (less the equal-batches leftovers) is received exactly once."""
    if repeat:  # the last run resumes on the interrupted topology
        last = runs[-1][0]
    selection = plan.Selection(streams=(tuple(counts),), equal_batches=equal)
    total = sum(counts)
    received: Counter[int] = Counter()
    interrupts: list[plan.Interrupt] = []
    for topology, batches in runs:
        for rank in range(topology.world_size):
            parts = [
                plan.consumer_part(selection, total, interrupts, topology, rank, w)
                for w in range(topology.workers)
            ]
            sizes = [len(positions(part)) for part in parts]
            per_worker = [
                plan.batch_count(n, topology.batch_size, topology.drop_last) for n in sizes
            ]
            taken = plan.round_robin_taken(per_worker, batches)
            for part, count in zip(parts, taken, strict=True):
                received.update(positions(part)[: count * topology.batch_size])
        interrupts.append(plan.Interrupt(topology, batches))
    for rank in range(last.world_size):
        for worker in range(last.workers):
            received.update(
                positions(plan.consumer_part(selection, total, interrupts, last, rank, worker))
            )
    assert all(count == 1 for count in received.values())
    if not equal:
        missing = total - len(received)
        # Only drop_last tails can be missing: never more than a batch per worker per run.
        allowed = sum(t.world_size * t.workers * t.batch_size for t, _ in runs if t.drop_last)
        assert missing <= allowed
        if not any(t.drop_last for t, _ in runs):
            assert sorted(received) == list(range(total))


def test_round_robin_passes_over_exhausted_workers():
    assert plan.round_robin_taken([1, 2, 2], 4) == [1, 2, 1]
    assert plan.round_robin_taken([0, 3], 2) == [0, 2]
    assert plan.round_robin_taken([2, 2], 99) == [2, 2]


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=4),
    weights=st.lists(st.sampled_from([0.3, 1, 2, 3, 7.5]), min_size=4, max_size=4),
    stop=st.sampled_from(plan.MIX_STOPS),
    seed=st.integers(0, 1000),
)
def test_mixed_prefixes_match_the_merged_order(lengths, weights, stop, seed):
    mixed = plan.MixedOrder(lengths, weights[: len(lengths)], stop, seed, 0)
    keys = sorted((mixed.key(s, i), s) for s, n in enumerate(lengths) for i in range(n))
    if stop == "first_exhausted":
        end = min((mixed.key(s, n), s) for s, n in enumerate(lengths))
        keys = [k for k in keys if k < end]
    assert len(keys) == mixed.length
    for position in range(mixed.length + 1):
        expected = [sum(1 for _, s in keys[:position] if s == t) for t in range(len(lengths))]
        assert mixed.prefix(position) == expected


def test_mixing_keeps_each_stage_share_in_every_stretch():
    mixed = plan.MixedOrder([3000, 1000], [3, 1], "all_exhausted", 7, 0)
    for start in range(0, 3600, 400):
        low, high = mixed.prefix(start), mixed.prefix(start + 400)
        assert abs((high[0] - low[0]) - 300) <= 2


def test_a_state_names_a_few_integers():
    interrupts = [plan.Interrupt(plan.Topology(1024, 16, 64, False), 10**9)] * 100
    state = {
        "version": 2,
        "selection": "0123456789abcdef",
        "epoch": 10**6,
        "interrupts": [i.to_json() for i in interrupts],
    }
    assert len(json.dumps(state, separators=(",", ":"))) <= 4096
    assert [plan.Interrupt.from_json(i) for i in state["interrupts"]] == interrupts


def test_the_plan_imports_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from syvain_training_data.loading import plan\n"
        "assert plan.split_evenly(10, 3, 1) == (3, 6)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_one_shard_feeds_64_ranks_of_8_workers():
    selection = plan.Selection(streams=((1000,),))
    topology = plan.Topology(64, 8, 4, False)
    sizes = [len(positions(part)) for part in consumers(selection, 1000, topology)]
    assert sum(sizes) == 1000 and max(sizes) - min(sizes) <= 1 and min(sizes) == 1


def test_shards_are_permuted_in_groups_and_still_once(monkeypatch):
    monkeypatch.setattr(plan, "SHARD_GROUP", 3)
    counts = (4, 1, 7, 2, 9, 3, 5, 6)
    selection = plan.Selection(streams=(counts,), seed=4, window=5)
    first = epoch_positions(selection, 0)
    assert sorted(first) == sorted((s, r) for s, n in enumerate(counts) for r in range(n))
    assert first != epoch_positions(selection, 1)
    order = selection.orders(0)[0]
    assert len(order.group_order) == 3
