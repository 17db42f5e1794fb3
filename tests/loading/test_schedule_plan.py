"""Mixture schedules as pure functions (``load_tokens(mixing_schedule=...)``): the scheduled
order and its segmented token layout over random selections and topologies."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from syvain_training_data.loading import (  # noqa: E402
    block_order,
    mixing,
    plan,
    schedule,
    token_plan,
)
from token_runs import simulate_run, token_topology  # noqa: E402

# --- the order -------------------------------------------------------------------------------


def phase_draws(seed, epoch):
    """The mixing phases in turn: unseeded, Python's documented-stable ``random()`` of the
    name; seeded, SplitMix64 of the name's SHA-256 (written out here, not the library's)."""
    if seed is None:
        draw = random.Random(f"syvain-plan:None:{epoch}:mix")
        while True:
            yield draw.random()
    state = block_order.plan_seed(seed, epoch, "mix")
    mask = 2**64 - 1
    while True:
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        yield ((z ^ (z >> 31)) >> 11) * 2.0**-53


def merged_by_brute_force(lengths, entries, stop, seed, epoch):
    """The scheduled order built record by record: each segment sorts the keys of every
    stream's remaining records (phases drawn in turn from the mix generator)."""
    draw = phase_draws(seed, epoch)
    used = [0 for _ in lengths]
    order: list[int] = []
    for index, (start, weights) in enumerate(entries):
        phases = [next(draw) for _ in lengths]
        shares = [w / sum(weights) for w in weights]
        rest = [n - u for n, u in zip(lengths, used, strict=True)]
        keys = sorted(
            ((i + phases[s]) / shares[s], s) for s in range(len(lengths)) for i in range(rest[s])
        )
        if stop == "first_exhausted":
            end = min(((rest[s] + phases[s]) / shares[s], s) for s in range(len(lengths)))
            keys = [k for k in keys if k < end]
        span = entries[index + 1][0] - start if index + 1 < len(entries) else None
        if span is None or len(keys) <= span:
            return order + [s for _, s in keys]
        for _, s in keys[:span]:
            order.append(s)
            used[s] += 1
    raise AssertionError("unreachable")


@st.composite
def schedules(draw, streams: int, most_position: int, min_weight: int = 1):
    count = draw(st.integers(1, 4))
    positions = sorted(draw(st.sets(st.integers(1, most_position), max_size=count - 1)))
    weight = st.integers(min_weight, 9).map(float)
    return tuple((p, tuple(draw(weight) for _ in range(streams))) for p in [0, *positions])


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=3),
    stop=st.sampled_from(mixing.MIX_STOPS),
    seed=st.sampled_from([None, 0, 5]),
)
def test_the_scheduled_order_is_the_segment_by_segment_merge(data, lengths, stop, seed):
    entries = data.draw(schedules(len(lengths), 90))
    order = schedule.ScheduledOrder(lengths, entries, stop, seed, 3)
    expected = merged_by_brute_force(lengths, entries, stop, seed, 3)
    assert order.length == len(expected)
    assert list(order.labels(0, order.length)) == expected
    for position in range(order.length + 1):
        assert order.prefix(position) == [expected[:position].count(s) for s in range(len(lengths))]
    start = data.draw(st.integers(0, order.length))
    stop_at = data.draw(st.integers(start, order.length))
    assert list(order.labels(start, stop_at)) == expected[start:stop_at]
    if len(entries) == 1:  # mixing_weights' order, bit for bit
        mixed = mixing.MixedOrder(lengths, entries[0][1], stop, seed, 3)
        assert mixed.length == order.length
        assert list(mixed.labels(0, mixed.length)) == expected


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    lengths=st.lists(st.integers(1500, 4000), min_size=2, max_size=3),
    stop=st.sampled_from(mixing.MIX_STOPS),
    seed=st.integers(0, 2**32),
)
def test_every_segment_keeps_each_stage_share_in_every_400_positions(data, lengths, stop, seed):
    entries = data.draw(schedules(len(lengths), sum(lengths)))
    order = schedule.ScheduledOrder(lengths, entries, stop, seed, 0)
    starts = [p for p, _ in entries if p < order.length]
    ends = [*starts[1:], order.length]
    for (start, weights), end in zip(entries, ends, strict=False):
        shares = [w / sum(weights) for w in weights]
        for low in range(start, end - 400 + 1, 37):
            before, after = order.prefix(low), order.prefix(low + 400)
            if any(a >= n for a, n in zip(after, lengths, strict=True)):
                break  # a stream ran out (all_exhausted): the shares hold no longer
            for s, share in enumerate(shares):
                assert abs((after[s] - before[s]) - 400 * share) <= 2, (start, low, s)


def test_the_order_costs_segments_not_records(monkeypatch):
    """A schedule of 64 segments over 2*10^9 records: the order's length, prefixes and labels
    cost tens of thousands of record keys, not one per record, and agree with each other (each label
    is the stream whose prefix count grows by one there) and with the segments' shares."""
    keys = Counter[str]()
    key = mixing.MixedOrder.key

    def counted(self, stream, index):
        keys["key"] += 1
        return key(self, stream, index)

    monkeypatch.setattr(mixing.MixedOrder, "key", counted)
    lengths = [10**9, 3 * 10**8, 7 * 10**8]
    entries = tuple((k * 10**7, (1.0 + k % 3, 2.0, 1.0 + k % 5)) for k in range(64))
    order = schedule.ScheduledOrder(lengths, entries, "first_exhausted", 1, 0)
    assert 63 * 10**7 < order.length <= sum(lengths)
    middle = order.length // 2
    counts = order.prefix(middle)
    assert sum(counts) == middle
    start = 10**8 + 3  # inside segment 10
    labels = list(order.labels(start, start + 50))
    # A binary search per segment (64 x 3 streams x ~64 halvings): not a key per record.
    assert keys["key"] < 100_000, keys  # checking the results below costs more keys
    prefixes = [order.prefix(p) for p in range(start, start + 51)]
    grew = [
        [s for s in range(3) if after[s] - before[s] == 1]
        for before, after in zip(prefixes, prefixes[1:], strict=False)
    ]
    assert [[label] for label in labels] == grew
    for (position, weights), (end, _) in zip(entries, entries[1:], strict=False):
        shares = [w / sum(weights) for w in weights]
        took = [b - a for a, b in zip(order.prefix(position), order.prefix(end), strict=True)]
        for s, share in enumerate(shares):
            # within 1 + 3 * share of its share (three streams' phases): at most 3
            assert abs(took[s] - (end - position) * share) <= 3, (position, s)


# --- the segmented token layout ---------------------------------------------------------------


@st.composite
def segmented(draw):
    lengths = draw(st.lists(st.integers(0, 20), min_size=1, max_size=50))
    inner = sorted(draw(st.sets(st.integers(1, max(1, len(lengths) - 1)), max_size=4)))
    inner = [b for b in inner if b < len(lengths)]
    return lengths, (0, *inner, len(lengths))


@settings(max_examples=200, deadline=None)
@given(
    case=segmented(),
    runs=st.lists(st.tuples(token_topology, st.integers(0, 6)), min_size=1, max_size=3),
    last=token_topology,
    seq_len=st.sampled_from([1, 1, 2, 3, 5, 8]),
    repeat=st.booleans(),
)
def test_resumes_across_segment_boundaries_yield_each_token_once(case, runs, last, seq_len, repeat):
    lengths, boundaries = case
    if repeat:
        last = runs[-1][0]
    interrupts: list[token_plan.TokenInterrupt] = []
    received: list[int] = []
    for topology, taken in runs:
        tokens, interrupt, _ = simulate_run(
            lengths, interrupts, topology, seq_len, taken, boundaries
        )
        received += tokens
        interrupts.append(interrupt)
    tokens, _, _ = simulate_run(lengths, interrupts, last, seq_len, None, boundaries)
    received += tokens
    counts = Counter(received)
    assert not counts or max(counts.values()) == 1, "a token was yielded twice"
    if seq_len == 1 and not last.drop_last:  # nothing is left out: every token once
        assert sorted(counts) == list(range(sum(lengths)))
    consumers = sum(t.world_size * t.workers for t, _ in [*runs, (last, 0)])
    slack = max(t.batch_size for t, _ in [*runs, (last, 0)]) * seq_len
    assert sum(lengths) - len(counts) <= consumers * slack


@settings(max_examples=100, deadline=None)
@given(
    case=segmented(), topology=token_topology, seq_len=st.integers(1, 6), taken=st.integers(0, 8)
)
def test_same_topology_segmented_resume_is_the_uninterrupted_stream(case, topology, seq_len, taken):
    lengths, boundaries = case
    _, _, whole = simulate_run(lengths, [], topology, seq_len, None, boundaries)
    _, interrupt, head = simulate_run(lengths, [], topology, seq_len, taken, boundaries)
    _, _, tail = simulate_run(lengths, [interrupt], topology, seq_len, None, boundaries)
    for rank in range(topology.world_size):
        assert head[rank] + tail[rank] == whole[rank]


@settings(max_examples=100, deadline=None)
@given(
    case=segmented(),
    runs=st.lists(st.tuples(token_topology, st.integers(0, 6)), max_size=2),
    topology=token_topology,
)
def test_every_consumer_takes_its_share_of_each_segment(case, runs, topology):
    """Fresh or resumed, a new topology gives each consumer an even share of what is left of
    each segment, segment after segment (parts ascending); one boundary pair is today's
    layout."""
    lengths, boundaries = case
    interrupts: tuple[token_plan.TokenInterrupt, ...] = ()
    for t, taken in runs:  # as a loader's state holds them: runs on one topology in a row merge
        interrupt = simulate_run(lengths, interrupts, t, 2, taken, boundaries)[1]
        interrupts = plan.appended(interrupts, interrupt)
    if interrupts and interrupts[-1].topology == topology:
        return  # a continuation keeps the interrupted run's parts
    layout, _ = token_plan.token_layout(len(lengths), interrupts, topology, None, boundaries)
    parts = [part for rank in range(topology.world_size) for part in layout[rank]]
    for part in parts:
        flat = [p for a, b in part for p in range(a, b)]
        assert flat == sorted(flat)
    for low, high in zip(boundaries, boundaries[1:], strict=False):
        per_rank = [
            sum(max(0, min(b, high) - max(a, low)) for part in layout[r] for a, b in part)
            for r in range(topology.world_size)
        ]
        assert max(per_rank) - min(per_rank) <= 1
        for r in range(topology.world_size):
            per_worker = [
                sum(max(0, min(b, high) - max(a, low)) for a, b in part) for part in layout[r]
            ]
            assert max(per_worker) - min(per_worker) <= 1
    if len(boundaries) == 2:
        assert layout == token_plan.token_layout(len(lengths), interrupts, topology)[0]


def test_consumed_through_is_the_last_position_a_run_touched():
    topology = plan.Topology(2, 1, 1, False)
    segments = (6, 12)
    layout, _ = token_plan.token_layout(12, [], topology, None, (0, *segments))
    assert layout == {0: [[(0, 3), (6, 9)]], 1: [[(3, 6), (9, 12)]]}
    # rank 0 consumed 2 records and 5 tokens of the third, rank 1 four records (into segment 1)
    stop = token_plan.TokenInterrupt(topology, (((2, 5),), ((4, 0),)), (0, 0), (False, False))
    assert schedule.consumed_through(segments, [stop], topology) == 9
    nothing = token_plan.TokenInterrupt(topology, (((0, 0),), ((0, 0),)), (0, 0), (False, False))
    assert schedule.consumed_through(segments, [nothing], topology) == -1
    old = ((0, (3.0, 1.0)), (6, (1.0, 3.0)))
    later = (*old, (10, (2.0, 2.0)))
    schedule.check_resume(old, later, segments, [stop], topology)
    moved = ((0, (3.0, 1.0)), (10, (1.0, 3.0)))  # segment 1 now starts at 10: differs from 6
    with pytest.raises(
        ValueError,
        match=r"from position 6 \(entry 1: the state's position 6 weights \[1.0, 3.0\], "
        r"this loader's position 10 weights \[1.0, 3.0\]\), at or before epoch position 9",
    ):
        schedule.check_resume(old, moved, segments, [stop], topology)
    with pytest.raises(ValueError, match=r"from position 0 \(entry 0: .*weights \[2.0, 1.0\]"):
        schedule.check_resume(old, ((0, (2.0, 1.0)), (6, (1.0, 3.0))), segments, [stop], topology)
    assert schedule.first_difference(old, old[:1]) == (1, 6, old[1], None)
    assert schedule.first_difference(old[:1], old) == (1, 6, None, old[1])
    assert schedule.first_difference(old, later) == (2, 10, None, later[2])
