"""Loader states are input: the checks every field of a ``load_state_dict`` state passes.

A checkpoint can be corrupt, truncated, edited or hostile. Every field is checked for its type
and bounded before anything is computed from it, so no check, error message or plan
computation costs time or memory that grows with the values a state claims: a state with
``world_size=10**9`` is a ValueError at once, not a layout of 10^9 ranks. Errors are ValueErrors
that name the field (``interrupts[0][0] (world_size)``, ``epoch``). No torch here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "MAX_BATCH_SIZE",
    "MAX_CONSUMERS",
    "MAX_COUNT",
    "MAX_ENTRIES",
    "MAX_RUNS",
    "MAX_STATE_CONSUMERS",
    "MAX_STRING",
    "MAX_WORKERS",
    "MAX_WORLD_SIZE",
    "describe",
    "epoch",
    "epoch_of",
    "field",
    "flag",
    "integer",
    "items",
    "string",
]

# Topologies (loading.plan.Topology refuses larger ones, so every state a loader saves loads).
MAX_WORLD_SIZE = 2**20
MAX_WORKERS = 1024
MAX_BATCH_SIZE = 2**24
# Consumers (ranks x workers) of one run: a resumed plan lays out every earlier run's consumers.
MAX_CONSUMERS = 2**20
# ... summed over the runs one state names.
MAX_STATE_CONSUMERS = 2**22
# Epochs, batches, records and token offsets.
MAX_COUNT = 2**63 - 1
# Interrupted runs of one epoch a state names, consecutive runs on one topology counting as one
# (their entries merge): at most 46 bytes each at the maxima above, so a record loader's state
# stays under SPEC's 4 KiB.
MAX_RUNS = 64
# Entries of a state's ``interrupts`` list: states of earlier versions kept one entry per run,
# up to 100, even for runs on one topology.
MAX_ENTRIES = 256
# Strings a state holds (a selection digest, a kind).
MAX_STRING = 64


def describe(value: object) -> str:
    """A short description of a state value for an error message: never long, and never slow
    to build (no repr of a huge list, no decimal digits of a huge int)."""
    if value is None or isinstance(value, bool | float):
        return repr(value)
    if isinstance(value, int):
        return repr(value) if value.bit_length() <= 64 else f"an int of {value.bit_length()} bits"
    if isinstance(value, str):
        return repr(value) if len(value) <= MAX_STRING else f"a str of {len(value)} characters"
    if isinstance(value, list | tuple | dict):
        return f"a {type(value).__name__} of {len(value)} items"
    return f"a {type(value).__name__}"


def _invalid(name: str, problem: str) -> ValueError:
    return ValueError(f"Invalid loader state: {name} {problem}")


def field(state: Mapping[str, Any], key: str, name: str | None = None) -> Any:
    """``state[key]``; a ValueError naming the field when it is missing."""
    if key not in state:
        raise _invalid(name or key, "is missing")
    return state[key]


def integer(value: object, name: str, low: int = 0, high: int = MAX_COUNT) -> int:
    """``value`` as an int in [low, high] (a bool is not an int here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(name, f"must be an int, got {describe(value)}")
    if not low <= value <= high:
        raise _invalid(name, f"must be in [{low}, {high}], got {describe(value)}")
    return value


def flag(value: object, name: str) -> bool:
    """``value``, a bool written as 0 or 1, as a bool."""
    return bool(integer(value, name, 0, 1))


def string(value: object, name: str, longest: int = MAX_STRING) -> str:
    if not isinstance(value, str):
        raise _invalid(name, f"must be a str, got {describe(value)}")
    if len(value) > longest:
        raise _invalid(name, f"must be at most {longest} characters, got {len(value)}")
    return value


def items(value: object, name: str, longest: int, exactly: int | None = None) -> list[Any]:
    """``value`` as a list of at most ``longest`` (or ``exactly``) items."""
    if not isinstance(value, list):
        raise _invalid(name, f"must be a list, got {describe(value)}")
    if exactly is not None and len(value) != exactly:
        raise _invalid(name, f"must hold {exactly} items, got {len(value)}")
    if len(value) > longest:
        raise _invalid(name, f"must hold at most {longest} items, got {len(value)}")
    return value


def epoch(value: object) -> int:
    """An epoch given to ``set_epoch``: an int in [0, MAX_COUNT], the bounds of a state's."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise ValueError(f"epoch must be a non-negative int below 2**63, got {value!r}")
    return value


def epoch_of(state: Mapping[str, Any]) -> int:
    """A state's ``epoch`` field, checked."""
    return integer(field(state, "epoch"), "epoch")
