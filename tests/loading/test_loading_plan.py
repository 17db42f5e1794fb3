"""The epoch plan alone (no torch, no I/O): properties over random selections and topologies."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Iterator

from hypothesis import given, settings
from hypothesis import strategies as st

from loader_data import run_python, topologies
from syvain_training_data.loading import block_order, mixing, plan, record_plan
from syvain_training_data.loading.block_order import BlockOrder, window_counts

counts_strategy = st.lists(st.integers(1, 60), min_size=1, max_size=12)
topology_strategy = topologies(128, 17, 64)


# Resume chains recompute each consumer's part alone, as a worker does: smaller topologies.
small_topology = topologies(12, 5, 16)


def epoch_positions(read_plan: plan.ReadPlan, epoch: int) -> list[tuple[int, int]]:
    """Every position of the epoch as (shard, record), in epoch order (single stream)."""
    order = read_plan.orders(epoch)[0]
    if isinstance(order, plan.StreamOrder):
        return [(s, r) for s, a, b in order.segments(0, order.total) for r in range(a, b)]
    return list(order.records(0, order.total))


def consumers(
    read_plan: plan.ReadPlan, total: int, topology: plan.Topology
) -> list[list[tuple[int, int]]]:
    layout = record_plan.run_layout(read_plan, total, (), topology)
    return [part for rank in sorted(layout) for part in layout[rank]]


def positions(intervals: list[tuple[int, int]]) -> list[int]:
    return [p for start, stop in intervals for p in range(start, stop)]


@settings(max_examples=120, deadline=None)
@given(counts=counts_strategy, topology=topology_strategy, equal=st.booleans())
def test_parts_are_disjoint_complete_balanced_and_in_epoch_order(counts, topology, equal):
    read_plan = plan.ReadPlan(streams=(tuple(counts),), equal_batches=equal)
    total = sum(counts)
    parts = consumers(read_plan, total, topology)
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
            record_plan.rank_batches(read_plan, total, (), topology, r)
            for r in range(topology.world_size)
        }
        assert len(batches) == 1


@st.composite
def blocked_counts(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    counts = draw(counts_strategy)
    return tuple(counts), tuple(draw(st.integers(1, n)) for n in counts)


@settings(max_examples=150, deadline=None)
@given(blocked=blocked_counts(), seed=st.integers(0, 2**32), window=st.integers(0, 40))
def test_the_seeded_order_is_a_permutation_of_blocks_interleaved_in_order(blocked, seed, window):
    counts, blocks = blocked
    read_plan = plan.ReadPlan(
        streams=(counts,), seed=seed, window=window, blocks=(blocks,), indexed=True
    )
    every = sorted((s, r) for s, n in enumerate(counts) for r in range(n))
    first = epoch_positions(read_plan, 0)
    assert sorted(first) == every
    assert epoch_positions(read_plan, 0) == first
    order = read_plan.orders(0)[0]
    assert isinstance(order, BlockOrder)
    # Each window holds `window` to 2 x `window` - 1 blocks (fewer only when the group has
    # fewer), each a run of one shard, read in order.
    for window_ in {(w := order.window_at(p)).first: w for p in range(order.total)}.values():
        assert 1 <= len(window_.blocks) < 2 * max(1, window)
        held = [(s, a + i) for s, a, n in window_.blocks for i in range(n)]
        here = first[window_.first : window_.last]
        assert sorted(here) == sorted(held)
        for s, a, n in window_.blocks:
            assert [r for t, r in here if t == s and a <= r < a + n] == list(range(a, a + n))
            assert a % blocks[s] == 0 and n == min(blocks[s], counts[s] - a)


@settings(max_examples=150, deadline=None)
@given(blocked=blocked_counts(), seed=st.integers(0, 1000), cuts=st.lists(st.integers(0, 10**6)))
def test_any_stretch_of_a_window_reads_one_contiguous_range_per_block(blocked, seed, cuts):
    """What lets a consumer whose part starts inside a window read only its own records: the
    positions [low, high) hold, of each block, the records window_counts(low) to
    window_counts(high)."""
    counts, blocks = blocked
    read_plan = plan.ReadPlan(
        streams=(counts,), seed=seed, window=8, blocks=(blocks,), indexed=True
    )
    order = read_plan.orders(1)[0]
    total = order.total
    marks = sorted({0, total, *(c % (total + 1) for c in cuts)})
    for low, high in itertools.pairwise(marks):
        expected = list(order.records(low, high))
        got = []
        for window_, a, b in order.windows(low, high):
            before, until = window_counts(window_, a), window_counts(window_, b)
            runs = [
                iter(range(first + x, first + y))
                for (_, first, _), x, y in zip(window_.blocks, before, until, strict=True)
            ]
            labels = [0] * (b - a) if window_.labels is None else window_.labels[a:b]
            got += [(window_.blocks[k][0], next(runs[k])) for k in labels]
            assert all(next(run, None) is None for run in runs)
        assert got == expected


def test_windows_mix_blocks_from_across_the_selection():
    """64 shards of 500 records, one block each: a window of 64 blocks is the whole selection,
    and a batch of 32 consecutive positions draws from about as many shards as a uniform
    permutation's (25.3)."""
    counts = (500,) * 64
    read_plan = plan.ReadPlan(streams=(counts,), seed=3, window=64, blocks=(counts,), indexed=True)
    order = list(read_plan.orders(0)[0].records(0, 32_000))
    distinct = [len({s for s, _ in order[i : i + 32]}) for i in range(0, 32_000, 32)]
    assert sum(distinct) / len(distinct) > 0.9 * 25.3


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
    read_plan = plan.ReadPlan(streams=(tuple(counts),), equal_batches=equal)
    total = sum(counts)
    received: Counter[int] = Counter()
    interrupts: list[plan.Interrupt] = []
    for topology, batches in runs:
        for rank in range(topology.world_size):
            parts = [
                record_plan.consumer_part(read_plan, total, interrupts, topology, rank, w)
                for w in range(topology.workers)
            ]
            sizes = [len(positions(part)) for part in parts]
            per_worker = [
                plan.batch_count(n, topology.batch_size, topology.drop_last) for n in sizes
            ]
            taken = record_plan.round_robin_taken(per_worker, batches)
            for part, count in zip(parts, taken, strict=True):
                received.update(positions(part)[: count * topology.batch_size])
        interrupts.append(plan.Interrupt(topology, batches))
    for rank in range(last.world_size):
        for worker in range(last.workers):
            received.update(
                positions(
                    record_plan.consumer_part(read_plan, total, interrupts, last, rank, worker)
                )
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
    assert record_plan.round_robin_taken([1, 2, 2], 4) == [1, 2, 1]
    assert record_plan.round_robin_taken([0, 3], 2) == [0, 2]
    assert record_plan.round_robin_taken([2, 2], 99) == [2, 2]


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=4),
    weights=st.lists(st.sampled_from([0.3, 1, 2, 3, 7.5]), min_size=4, max_size=4),
    stop=st.sampled_from(mixing.MIX_STOPS),
    seed=st.integers(0, 1000),
)
def test_mixed_prefixes_match_the_merged_order(lengths, weights, stop, seed):
    mixed = mixing.MixedOrder(lengths, weights[: len(lengths)], stop, seed, 0)
    keys = sorted((mixed.key(s, i), s) for s, n in enumerate(lengths) for i in range(n))
    if stop == "first_exhausted":
        end = min((mixed.key(s, n), s) for s, n in enumerate(lengths))
        keys = [k for k in keys if k < end]
    assert len(keys) == mixed.length
    for position in range(mixed.length + 1):
        expected = [sum(1 for _, s in keys[:position] if s == t) for t in range(len(lengths))]
        assert mixed.prefix(position) == expected


def test_mixing_keeps_each_stage_share_in_every_stretch():
    mixed = mixing.MixedOrder([3000, 1000], [3, 1], "all_exhausted", 7, 0)
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
    run_python(
        "import sys; sys.modules['torch'] = None",
        "from syvain_training_data.loading import plan",
        "assert plan.split_evenly(10, 3, 1) == (3, 6)",
    )


def test_one_shard_feeds_64_ranks_of_8_workers():
    read_plan = plan.ReadPlan(streams=((1000,),))
    topology = plan.Topology(64, 8, 4, False)
    sizes = [len(positions(part)) for part in consumers(read_plan, 1000, topology)]
    assert sum(sizes) == 1000 and max(sizes) - min(sizes) <= 1 and min(sizes) == 1


def test_blocks_are_permuted_in_groups_and_still_once(monkeypatch):
    monkeypatch.setattr(block_order, "GROUP_BLOCKS", 3)
    counts = (4, 1, 7, 2, 9, 3, 5, 6)
    blocks = (2, 1, 3, 2, 4, 1, 5, 2)
    read_plan = plan.ReadPlan(streams=(counts,), seed=4, window=5, blocks=(blocks,), indexed=True)
    first = epoch_positions(read_plan, 0)
    assert sorted(first) == sorted((s, r) for s, n in enumerate(counts) for r in range(n))
    assert first != epoch_positions(read_plan, 1)
    order = read_plan.orders(0)[0]
    assert len(order.group_bounds) > 3


def test_a_window_holds_a_bounded_interleaving(monkeypatch):
    """Whole-shard blocks of large shards (a dataset without indexes): a window takes fewer
    blocks rather than interleave more than MAX_WINDOW_RECORDS records."""
    monkeypatch.setattr(block_order, "MAX_WINDOW_RECORDS", 100)
    counts = (60, 50, 40, 200, 10)
    read_plan = plan.ReadPlan(streams=(counts,), seed=2, window=64)
    order = read_plan.orders(0)[0]
    windows = {(w := order.window_at(p)).first: w for p in range(order.total)}
    for window_ in windows.values():
        held = sum(n for _, _, n in window_.blocks)
        assert held <= 100 or len(window_.blocks) == 1
    assert sorted(epoch_positions(read_plan, 0)) == sorted(
        (s, r) for s, n in enumerate(counts) for r in range(n)
    )


# --- runs on one topology merge into one ----------------------------------------------------


def rank_rests(
    read_plan: plan.ReadPlan,
    total: int,
    interrupts: list[plan.Interrupt],
    interrupt: plan.Interrupt,
) -> list[list[int]]:
    """Per rank, the positions its workers had not consumed when a run of
    ``interrupt.topology`` after ``interrupts`` stopped after ``interrupt.batches`` batches."""
    layout = record_plan.run_layout(read_plan, total, interrupts, interrupt.topology)
    return [
        sorted(p for rest in record_plan._unread(layout[rank], interrupt) for p in positions(rest))
        for rank in sorted(layout)
    ]


@settings(max_examples=400, deadline=None)
@given(
    counts=counts_strategy,
    before=st.lists(st.tuples(small_topology, st.integers(0, 30)), max_size=2),
    topology=small_topology,
    first=st.integers(0, 30),
    second=st.integers(0, 30),
    after=small_topology,
    same_after=st.booleans(),
    equal=st.booleans(),
    mixed=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_two_runs_on_one_topology_are_one_run_of_both_batches(
    counts, before, topology, first, second, after, same_after, equal, mixed, seed
):
    """Runs of one topology stopped after b1 then b2 batches leave what one run stopped after
    b1 + b2 leaves, rank by rank, so the merged state is exact: a later run of that topology
    is laid out identically, worker for worker (drop_last, equal batches, mixing and ranks of
    unequal batch counts included: world sizes that do not divide the epoch)."""
    if mixed:  # two stages mixed: the epoch length comes from the mixed order
        half = max(1, len(counts) // 2)
        streams = (tuple(counts[:half]), tuple(counts[half:]) or (1,))
        read_plan = plan.ReadPlan(streams=streams, weights=(1.0, 2.5), seed=seed, window=3)
    else:
        read_plan = plan.ReadPlan(streams=(tuple(counts),), equal_batches=equal, seed=seed)
    total = plan.epoch_length(read_plan, 0)
    earlier: tuple[plan.Interrupt, ...] = ()
    for t, b in before:  # as the loader saves them: merged as they come
        earlier = plan.appended(earlier, plan.Interrupt(t, b))
    one, two = plan.Interrupt(topology, first), plan.Interrupt(topology, second)
    composed = [*earlier, one, two]
    merged = list(plan.appended(plan.appended(earlier, one), two))
    assert len(merged) == len(earlier) + (not earlier or earlier[-1].topology != topology)
    assert merged[-1].topology == topology and plan.topology_runs(
        [i.topology for i in merged]
    ) == len(merged)
    assert list(plan.merged_tail(composed)) == merged
    # What the two runs left is what the merged run left, rank by rank.
    assert rank_rests(read_plan, total, [*earlier, one], two) == rank_rests(
        read_plan, total, merged[:-1], merged[-1]
    )
    # A later run of that topology: the same layout, worker for worker.
    assert record_plan.run_layout(read_plan, total, composed, topology) == record_plan.run_layout(
        read_plan, total, merged, topology
    )
    for rank in range(topology.world_size):
        assert record_plan.rank_batches(read_plan, total, composed, topology, rank) == (
            record_plan.rank_batches(read_plan, total, merged, topology, rank)
        )
    # A later run of any topology reads the records both left. (Not always worker for worker:
    # after the two runs the rest lies in the second run's worker order, rotated by the first
    # one's turn, while the merged run leaves it in epoch order, as one uninterrupted run would;
    # so with equal batches, which fewer than world_size records a new topology leaves out can
    # differ.)
    if same_after:
        after = topology
    rest = sorted(p for rank in rank_rests(read_plan, total, merged[:-1], merged[-1]) for p in rank)
    from_composed = left(read_plan, total, composed, after)
    from_merged = left(read_plan, total, merged, after)
    if equal and after != topology:
        assert len(from_composed) == len(from_merged) > len(rest) - after.world_size
        assert set(from_composed) <= set(rest) and set(from_merged) <= set(rest)
    else:
        assert from_composed == from_merged == rest


def left(read_plan, total, interrupts, topology) -> list[int]:
    layout = record_plan.run_layout(read_plan, total, interrupts, topology)
    return sorted(p for parts in layout.values() for part in parts for p in positions(part))


def test_a_seeded_consumer_plans_its_windows_as_it_reads():
    """A worker's first record costs the same for a part of 10^9 records as for one of 10^3:
    windows are planned as the reader reaches them (before, all 122,071 windows of the part
    were planned first: 8.3 s and 59 MB), and a shard that claims 10^15 records costs no more."""
    from budget import line_budget
    from syvain_training_data.loading.reader import consumer_records

    def open_range(shard_range: tuple[int, int, int]) -> Iterator[tuple[int, int]]:
        shard, start, stop = shard_range
        return ((shard, record) for record in range(start, stop))

    for counts in ([10**9], [10**15], [10**6] * 1000):
        read_plan = plan.ReadPlan(streams=(tuple(counts),), seed=0, window=64)
        order = read_plan.orders(0)[0]
        with line_budget(300_000):  # ~180,000 lines for any part size; 7.6M before
            records = consumer_records(
                [order],
                [list(range(len(counts)))],
                None,
                [(0, order.total)],
                open_range,
                prefetch=True,
            )
            first = [next(records) for _ in range(8192 + 1)]
        assert len(set(first)) == len(first)
        records.close()


def test_unseeded_states_of_earlier_releases_still_load_and_seeded_ones_do_not():
    """The unseeded order did not change with the seeded block order (v3), so its fingerprint
    is the one earlier releases saved (values computed by the release before v3); a seeded
    state names another order and is refused."""
    mixed = plan.ReadPlan(
        streams=((5, 9, 3), (4,)), weights=(1.0, 2.0), equal_batches=True, identity="abc"
    )
    assert mixed.fingerprint() == "ec59a1e13d0fa877"
    assert plan.ReadPlan(streams=((5, 9, 3),), identity="abc").fingerprint() == "96168aa59c567146"
    seeded = plan.ReadPlan(streams=((5, 9, 3),), seed=1, window=64, identity="abc")
    assert (
        seeded.fingerprint()
        != plan.ReadPlan(
            streams=((5, 9, 3),),
            seed=1,
            window=64,
            identity="abc",
            blocks=((5, 3, 3),),
            indexed=True,
        ).fingerprint()
    )
