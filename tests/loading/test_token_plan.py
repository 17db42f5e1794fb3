"""The token plan alone (no I/O): cuts carried through resume chains, and resumes over random
data and topologies that yield each token once."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")


from syvain_training_data.loading import plan, token_plan  # noqa: E402
from token_runs import (  # noqa: E402
    simulate_run,
    token_topology,
)


def test_token_layout_cuts_carry_through_a_chain():
    # A 1-consumer run stopped inside record 4 at token 7 leaves the rest of record 4 first.
    one = plan.Topology(1, 1, 1, False)
    stop = token_plan.TokenInterrupt(one, (((4, 7),),), (0,), (False,))
    layout, cuts = token_plan.token_layout(10, [stop], plan.Topology(2, 1, 1, False))
    assert layout[0][0] == [(4, 7)] and layout[1][0] == [(7, 10)] and cuts == {4: 7}
    again = token_plan.TokenInterrupt(
        plan.Topology(2, 1, 1, False), (((0, 9),), ((1, 0),)), (0, 0), (False, False)
    )
    layout, cuts = token_plan.token_layout(10, [stop, again], one)
    assert layout[0][0] == [(4, 7), (8, 10)] and cuts == {4: 9}
    with pytest.raises(ValueError, match="went back inside record 4"):
        bad = token_plan.TokenInterrupt(
            plan.Topology(2, 1, 1, False), (((0, 3),), ((0, 0),)), (0, 0), (False, False)
        )
        token_plan.token_layout(10, [stop, bad], one)


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=40),
    runs=st.lists(st.tuples(token_topology, st.integers(0, 6)), min_size=1, max_size=3),
    last=token_topology,
    seq_len=st.integers(1, 12),
    repeat=st.booleans(),
)
def test_token_chains_yield_each_token_once(lengths, runs, last, seq_len, repeat):
    if repeat:
        last = runs[-1][0]
    interrupts: list[token_plan.TokenInterrupt] = []
    received: list[int] = []
    consumers = 0
    for topology, taken in runs:
        tokens, interrupt, _ = simulate_run(lengths, interrupts, topology, seq_len, taken)
        received += tokens
        interrupts.append(interrupt)
    tokens, _, _ = simulate_run(lengths, interrupts, last, seq_len, None)
    received += tokens
    consumers = sum(t.world_size * t.workers for t, _ in runs) + last.world_size * last.workers
    counts = Counter(received)
    assert not counts or max(counts.values()) == 1
    # Each consumer of each run leaves out fewer than seq_len tokens, or a smaller last batch
    # with drop_last (fewer than batch_size blocks).
    slack = max(t.batch_size for t, _ in [*runs, (last, 0)]) * seq_len
    assert sum(lengths) - len(counts) <= consumers * slack


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=40),
    topology=token_topology,
    seq_len=st.integers(1, 12),
    taken=st.integers(0, 8),
)
def test_same_topology_token_resume_is_the_uninterrupted_stream(lengths, topology, seq_len, taken):
    _, _, whole = simulate_run(lengths, [], topology, seq_len, None)
    _, interrupt, head = simulate_run(lengths, [], topology, seq_len, taken)
    _, _, tail = simulate_run(lengths, [interrupt], topology, seq_len, None)
    for rank in range(topology.world_size):
        assert head[rank] + tail[rank] == whole[rank]


def token_rest(lengths, interrupts):
    """What a run after ``interrupts`` has left: its positions, sorted, and the token each
    one resumes at."""
    layout, cuts = token_plan.token_layout(len(lengths), interrupts, plan.Topology(1, 1, 1, False))
    rest = sorted(p for start, stop in layout[0][0] for p in range(start, stop))
    return rest, {p: cuts[p] for p in rest if p in cuts}


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=40),
    before=st.lists(st.tuples(token_topology, st.integers(0, 6)), max_size=2),
    topology=token_topology,
    first=st.integers(0, 8),
    second=st.integers(0, 8),
    seq_len=st.integers(1, 12),
)
def test_two_token_runs_on_one_topology_are_one_run(
    lengths, before, topology, first, second, seq_len
):
    """A token run resumed on its own topology merges with it (token_plan.TokenInterrupt.then): per
    worker the records add up and the later offset wins, a worker that took nothing keeps its
    position, the turns add. The merged state is the one an uninterrupted run that took both
    runs' batches would have saved; it leaves the same records, cuts included; and a later run
    on that topology is laid out and streams exactly as after the two. (After the two, the rest
    lies in the second run's rotated worker order, after the merged one in epoch order, so a
    new topology splits the same records differently.)"""
    earlier: tuple[token_plan.TokenInterrupt, ...] = ()
    for t, taken in before:  # as the loader saves them: merged as they come
        _, interrupt, _ = simulate_run(lengths, list(earlier), t, seq_len, taken)
        earlier = plan.appended(earlier, interrupt)
    _, one, _ = simulate_run(lengths, list(earlier), topology, seq_len, first)
    _, two, _ = simulate_run(lengths, [*earlier, one], topology, seq_len, second)
    composed = [*earlier, one, two]
    merged = list(plan.appended(plan.appended(earlier, one), two))
    assert list(plan.merged_tail(composed)) == merged
    if not earlier or earlier[-1].topology != topology:
        _, whole, _ = simulate_run(lengths, list(earlier), topology, seq_len, first + second)
        assert merged == [*earlier, whole]
    assert token_rest(lengths, composed) == token_rest(lengths, merged)
    (layout, cuts), (merged_layout, merged_cuts) = (
        token_plan.token_layout(len(lengths), chain, topology) for chain in (composed, merged)
    )
    assert layout == merged_layout
    live = {p for parts in layout.values() for part in parts for a, b in part for p in range(a, b)}
    assert {p: c for p, c in cuts.items() if p in live} == {
        p: c for p, c in merged_cuts.items() if p in live
    }
    _, _, streams = simulate_run(lengths, composed, topology, seq_len, None)
    assert simulate_run(lengths, merged, topology, seq_len, None)[2] == streams
