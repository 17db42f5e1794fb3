"""The epoch order's one generator (``syvain_core::order`` through ``_native``): permutations,
interleavings, spread windows and mixing phases equal a pure-Python reference of SplitMix64,
Fisher-Yates and the spread merge, so the order is the same on every Python version and
platform; balanced windows and groups; a state of the earlier seeded order (Python's
``random.shuffle``) is refused by name, and one of the previous release's (uniformly
interleaved windows) resumes in its own order."""

from __future__ import annotations

import dataclasses
import heapq
from array import array
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from syvain_training_data import _native
from syvain_training_data.loading import block_order, plan
from syvain_training_data.loading.block_order import BlockOrder, plan_seed

MASK = 2**64 - 1


def splitmix64(seed: int):
    state = seed
    while True:
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        yield z ^ (z >> 31)


def reference_shuffle(items: list[int], seed: int) -> list[int]:
    draws = splitmix64(seed)
    for i in range(len(items) - 1, 0, -1):
        j = (next(draws) * (i + 1)) >> 64
        items[i], items[j] = items[j], items[i]
    return items


def reference_spread(counts: list[int], seed: int) -> list[int]:
    """``syvain_core::order::spread_labels``: record j of block k at the key
    (j + (phase_k + jitter) / 2) / counts[k], phases drawn in label order, each jitter when the
    block's previous record is emitted; labels in (key, label) order."""
    draws = splitmix64(seed)

    def unit() -> float:
        return (next(draws) >> 11) * 2.0**-53

    phases = [unit() for _ in counts]

    def key(record: int, label: int) -> float:
        return (record + (phases[label] + unit()) * 0.5) / counts[label]

    heap = [(key(0, label), label, 0) for label, count in enumerate(counts) if count]
    heapq.heapify(heap)
    labels = []
    while heap:
        _, label, record = heapq.heappop(heap)
        labels.append(label)
        if record + 1 < counts[label]:
            heapq.heappush(heap, (key(record + 1, label), label, record + 1))
    return labels


def native_permutation(count: int, seed: int) -> list[int]:
    return list(array("q", _native.permutation(count, seed)))


def test_the_generator_is_pinned():
    """Saved epoch orders depend on these values: they must never change."""
    assert native_permutation(10, 42) == [8, 3, 6, 5, 4, 0, 9, 2, 1, 7]
    assert native_permutation(12, 2**63 + 5) == [5, 6, 10, 1, 4, 11, 8, 7, 9, 2, 0, 3]
    assert _native.unit_draws(2, 0) == [0.8833108082136426, 0.43152799704850997]
    assert plan_seed(1, 0, 0, "shards") == 3242144543644926275
    assert list(block_order.permutation(6, 1, 0, 0, "shards")) == [2, 4, 1, 3, 0, 5]
    assert list(memoryview(_native.spread([2, 1, 3], 7)).cast("H")) == [2, 1, 0, 2, 0, 2]
    assert list(memoryview(_native.spread([3, 2, 4, 1], 12345)).cast("H")) == [
        2, 0, 1, 3, 2, 0, 2, 1, 0, 2,
    ]  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(count=st.integers(0, 300), seed=st.integers(0, MASK))
def test_permutations_equal_the_reference(count, seed):
    assert native_permutation(count, seed) == reference_shuffle(list(range(count)), seed)


@settings(max_examples=100, deadline=None)
@given(counts=st.lists(st.integers(0, 20), max_size=12), seed=st.integers(0, MASK))
def test_interleavings_equal_the_reference(counts, seed):
    labels = [label for label, count in enumerate(counts) for _ in range(count)]
    found = list(memoryview(_native.interleave(counts, seed)).cast("H"))
    assert found == reference_shuffle(labels, seed)


@settings(max_examples=100, deadline=None)
@given(counts=st.lists(st.integers(0, 20), max_size=12), seed=st.integers(0, MASK))
def test_spreads_equal_the_reference(counts, seed):
    found = list(memoryview(_native.spread(counts, seed)).cast("H"))
    assert found == reference_spread(counts, seed)


def test_a_spread_keeps_the_counts_and_refuses_bad_ones():
    counts = [5, 0, 17, 1, 300, 2]
    found = memoryview(_native.spread(counts, 1)).cast("H")
    assert Counter(found) == {k: c for k, c in enumerate(counts) if c}
    assert _native.spread([], 0) == b""
    with pytest.raises(ValueError, match="spread: counts\\[1\\] is -1"):
        _native.spread([3, -1], 0)
    with pytest.raises(ValueError, match="spread: .*2\\*\\*28"):
        _native.spread([2**27, 2**27, 1], 0)


def test_a_spread_window_mixes_more_blocks_per_run_than_a_uniform_interleaving():
    """64 equal blocks: a run of 32 positions holds about 31 distinct blocks, a uniform
    interleaving about 25.5 (and a uniform permutation of many shards 32)."""

    def distinct_per_run(labels: memoryview) -> float:
        runs = [set(labels[i : i + 32]) for i in range(0, len(labels), 32)]
        return sum(map(len, runs)) / len(runs)

    for seed in range(5):
        spread = distinct_per_run(memoryview(_native.spread([20] * 64, seed)).cast("H"))
        uniform = distinct_per_run(memoryview(_native.interleave([20] * 64, seed)).cast("H"))
        assert spread >= 30.5 and uniform <= 27, (spread, uniform)


@settings(max_examples=50, deadline=None)
@given(count=st.integers(0, 50), seed=st.integers(0, MASK))
def test_unit_draws_equal_the_reference(count, seed):
    draws = splitmix64(seed)
    expected = [(next(draws) >> 11) * 2.0**-53 for _ in range(count)]
    assert _native.unit_draws(count, seed) == expected


def test_oversized_draws_are_refused():
    with pytest.raises(ValueError, match="at most"):
        _native.permutation(2**40, 1)


def test_the_shard_order_is_the_reference_permutation():
    counts = [5] * 40
    order = BlockOrder(counts, counts, seed=7, epoch=2, number=0, window=8)
    seed = plan_seed(7, 2, 0, "shards")
    assert list(order.shard_order) == reference_shuffle(list(range(40)), seed)


@pytest.mark.parametrize(
    "blocks,window", [(65, 64), (127, 64), (129, 64), (64, 64), (3, 64), (100, 7)]
)
def test_windows_are_balanced_never_a_small_remainder(blocks, window):
    order = BlockOrder([10] * blocks, [10] * blocks, seed=1, epoch=0, number=0, window=window)
    sizes = []
    position = 0
    while position < order.total:
        found = order.window_at(position)
        sizes.append(len(found.blocks))
        position = found.last
    assert sum(sizes) == blocks
    assert max(sizes) < 2 * window and max(sizes) - min(sizes) <= 1
    assert min(sizes) >= min(blocks, window)


def test_groups_are_balanced(monkeypatch):
    monkeypatch.setattr(block_order, "GROUP_BLOCKS", 100)
    order = BlockOrder([1] * 201, [1] * 201, seed=1, epoch=0, number=0, window=64)
    sizes = [b - a for a, b in zip(order.group_bounds, order.group_bounds[1:], strict=False)]
    assert sizes == [67, 67, 67]


def test_a_state_of_the_earlier_seeded_order_is_refused_by_name():
    read_plan = plan.ReadPlan(streams=((5, 9, 3),), seed=1, window=64, identity="abc")
    earlier = read_plan.fingerprint(earlier_release=True)
    assert earlier != read_plan.fingerprint()
    generic = "another selection"
    reason = read_plan.refusal(earlier, plan.ReadPlan.fingerprint, generic)
    assert "earlier release's seeded order" in reason
    assert read_plan.refusal("0" * 16, plan.ReadPlan.fingerprint, generic) == generic
    # An unseeded plan's fingerprint is the earlier releases' (its states keep loading).
    unseeded = dataclasses.replace(read_plan, seed=None, window=0)
    assert unseeded.fingerprint() == unseeded.fingerprint(earlier_release=True)


def test_a_state_of_the_previous_release_resumes_in_its_uniformly_interleaved_order():
    read_plan = plan.ReadPlan(
        streams=((5, 9, 3),), seed=1, window=64, identity="abc", blocks=((5, 3, 3),), indexed=True
    )
    previous = dataclasses.replace(read_plan, spread=False)
    # The previous release's fingerprint of this plan (its code gave exactly this value).
    assert previous.fingerprint() == "adfc01da48009524" != read_plan.fingerprint()
    assert read_plan.resumed_by(read_plan.fingerprint(), plan.ReadPlan.fingerprint) is read_plan
    assert read_plan.resumed_by(previous.fingerprint(), plan.ReadPlan.fingerprint) == previous
    assert read_plan.resumed_by("0" * 16, plan.ReadPlan.fingerprint) is None
    (order,) = previous.orders(0)
    window = order.window_at(0)
    assert window.labels is not None
    counts = [count for _, _, count in window.blocks]
    seed = plan_seed(1, 0, 0, "window", 0, 0)
    assert bytes(window.labels) == _native.interleave(counts, seed)
    assert bytes(read_plan.orders(0)[0].window_at(0).labels or b"") == _native.spread(counts, seed)


def test_a_state_of_the_other_index_answer_is_refused_naming_the_option():
    indexed = plan.ReadPlan(
        streams=((5, 9, 3),), seed=1, window=64, identity="abc", blocks=((5, 3, 3),), indexed=True
    )
    whole = dataclasses.replace(indexed, indexed=False)
    assert indexed.fingerprint() != whole.fingerprint()
    reason = whole.refusal(indexed.fingerprint(), plan.ReadPlan.fingerprint, "other")
    assert "with record offset indexes" in reason and "indexes=True" in reason
    reason = indexed.refusal(whole.fingerprint(), plan.ReadPlan.fingerprint, "other")
    assert "without record offset indexes" in reason and "indexes=False" in reason
    # Whole shards order alike whatever block sizes an index would give.
    assert list(whole.orders(0)[0].records(0, 17)) == list(
        dataclasses.replace(whole, blocks=None).orders(0)[0].records(0, 17)
    )


def test_65_equal_shards_have_no_single_source_batch():
    """64 blocks and a lone 65th read in order made 15 single-source batches of 32 an epoch."""
    order = BlockOrder([500] * 65, [500] * 65, seed=0, epoch=0, number=0, window=64)
    shards = [shard for shard, _ in order.records(0, order.total)]
    batches = [shards[i : i + 32] for i in range(0, len(shards), 32)]
    assert min(len(set(batch)) for batch in batches[:-1]) > 1
