"""A token loader's state as plain JSON (``load_tokens``' ``state_dict``): each interrupted
run's entry, read back field by field with every bound checked before anything is computed from
it, and the merge of every rank's state when ranks are not one torch.distributed group."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from syvain_training_data.loading import plan, token_plan
from syvain_training_data.loading import state as checks

__all__ = ["gather_entries", "interrupts_from_json", "merge_token_states"]


def gather_entries(entry: list[int], world_size: int) -> list[list[int]]:
    distributed = torch.distributed
    if (
        world_size > 1
        and distributed.is_available()
        and distributed.is_initialized()
        and distributed.get_world_size() == world_size
    ):
        gathered: list[Any] = [None] * world_size
        distributed.all_gather_object(gathered, entry)
        return sorted(gathered)
    return [entry]


def interrupts_from_json(
    value: object, length: int, records: int
) -> tuple[token_plan.TokenInterrupt, ...]:
    """A token state's ``interrupts`` in an epoch of ``length`` records of a selection of
    ``records``, checked field by field (ValueError naming it) before anything is computed from
    them; the consumers of all entries are bounded before their positions are read, so the
    work is that of the state's size."""
    entries = checks.items(value, "interrupts", checks.MAX_ENTRIES)
    interrupts = []
    consumers = 0
    for index, entry in enumerate(entries):
        name = f"interrupts[{index}]"
        topology = plan.Topology.from_json(checks.items(entry, name, 5, exactly=5), name)
        topology.check_workers(records, name)
        consumers += topology.consumers
        if consumers > checks.MAX_STATE_CONSUMERS:
            raise ValueError(
                f"Invalid loader state: interrupts name more than {checks.MAX_STATE_CONSUMERS} "
                "consumers (ranks x workers over its runs)"
            )
        interrupts.append(token_plan.TokenInterrupt.from_json(entry, name, length))
    problem = plan.beyond_bounds([interrupt.topology for interrupt in interrupts])
    if problem is not None:
        raise ValueError(f"Invalid loader state: interrupts {problem}")
    return tuple(interrupts)


def merge_token_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One state from the ``state_dict()`` of every rank of a token loader whose ranks are not
    one torch.distributed group (each then holds only its own positions).

    Raises ValueError when the states are of different selections, epochs or runs, or not
    token loader states (``load_state_dict`` checks the merged state field by field)."""
    if not states:
        raise ValueError("merge_token_states needs at least one state")
    for k, state in enumerate(states):
        if not isinstance(state, dict) or not isinstance(state.get("interrupts"), list):
            raise ValueError(f"states[{k}] is not a token loader state")
    first = states[0]
    for state in states:
        if {k: v for k, v in state.items() if k != "interrupts"} != {
            k: v for k, v in first.items() if k != "interrupts"
        } or len(state["interrupts"]) != len(first["interrupts"]):
            raise ValueError("These token loader states come from different runs")
    if not first["interrupts"]:
        return dict(first)
    seen: dict[int, list[int]] = {}
    last: list[Any] = []
    for k, state in enumerate(states):
        entry = checks.items(state["interrupts"][-1], f"states[{k}] interrupts[-1]", 5, exactly=5)
        if not last:
            last = [*entry[:4], []]
        if entry[:4] != last[:4] or state["interrupts"][:-1] != first["interrupts"][:-1]:
            raise ValueError("These token loader states come from different runs")
        ranks = checks.items(entry[4], f"states[{k}] interrupts[-1][4]", checks.MAX_WORLD_SIZE)
        for j, rank_entry in enumerate(ranks):
            where = f"states[{k}] interrupts[-1][4][{j}]"
            checks.items(rank_entry, where, 3 + 2 * checks.MAX_WORKERS)
            if not rank_entry:
                raise ValueError(f"Invalid loader state: {where} is empty")
            rank = checks.integer(rank_entry[0], f"{where}[0] (rank)", 0, checks.MAX_WORLD_SIZE - 1)
            seen[rank] = rank_entry
    last[4] = [seen[rank] for rank in sorted(seen)]
    return {**first, "interrupts": [*first["interrupts"][:-1], last]}
