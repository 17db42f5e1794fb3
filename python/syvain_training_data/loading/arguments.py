"""The arguments ``SplitDataLoader.load`` and ``load_tokens`` share (:class:`LoadOptions`), and
the checks of those that stand alone: ints, ranks, mixing weights, the row options of
``pack=False``. Each raises a ValueError (TypeError for a value of the wrong type) that names
the argument."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import torch

from syvain_training_data.argument_checks import boolean
from syvain_training_data.loading.packing import TRUNCATE_MODES, RowOptions

__all__ = [
    "MIN_MIXING_SHARE",
    "LoadOptions",
    "batch_args",
    "check_int",
    "check_mixing_weights",
    "resolve_ranks",
    "row_options",
    "shown",
]


@dataclass(frozen=True)
class LoadOptions:
    """The keyword arguments ``load`` and ``load_tokens`` share, as given (``SplitDataLoader``
    checks them where it plans the load): which shards (a split, a stage or stages), how
    stages mix, the order (seed, shuffle window), this process's part (rank, world_size,
    equal batches) and what the returned loader does (endless, stats logging)."""

    split: str
    curriculum_stage: str | None = None
    curriculum_stages: Sequence[str] | None = None
    rank: int | None = None
    world_size: int | None = None
    equal_batches: bool = False
    seed: int | None = None
    shuffle_buffer: int | None = None
    mixing_weights: Mapping[str, float] | str | None = None
    mixing_schedule: object = None
    mixing_stop: str = "first_exhausted"
    infinite_iter: bool = False
    log_stats_every: float | None = None
    indexes: bool | None = None
    index_root: str | None = None

    def __post_init__(self) -> None:
        """The checks of the options that stand alone, at the call (the rest are checked where
        ``SplitDataLoader`` plans the load)."""
        boolean(self.equal_batches, "equal_batches")
        boolean(self.infinite_iter, "infinite_iter")
        if self.indexes is not None:
            boolean(self.indexes, "indexes")
        if self.shuffle_buffer is not None and self.seed is None:
            raise ValueError(
                "shuffle_buffer needs seed: without a seed the order is the manifest's and "
                "nothing is shuffled"
            )


def batch_args(args: dict[str, Any]) -> tuple[int, bool]:
    """(batch_size, drop_last) taken out of DataLoader arguments, for a dataset that batches
    its records itself (``batch_size`` None: batches of one record)."""
    batch_size = args.pop("batch_size", 1)
    batch_size = 1 if batch_size is None else check_int(batch_size, "batch_size")
    return batch_size, bool(args.pop("drop_last", False))


def check_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    return value


def resolve_ranks(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world_size): given explicitly, else from an initialised torch.distributed."""
    if (rank is None) != (world_size is None):
        raise ValueError("Pass both rank and world_size, or neither")
    if rank is None or world_size is None:
        distributed = torch.distributed
        if distributed.is_available() and distributed.is_initialized():
            return distributed.get_rank(), distributed.get_world_size()
        return 0, 1
    rank = check_int(rank, "rank")
    world_size = check_int(world_size, "world_size")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    return rank, world_size


def row_options(pack: bool, pad_id: int | None, truncate: str) -> RowOptions | None:
    """``load_tokens``' row-per-record options (None: packed blocks), checked."""
    if truncate not in TRUNCATE_MODES:
        raise ValueError(f"truncate must be one of {', '.join(TRUNCATE_MODES)}, got {truncate!r}")
    if pack:
        if pad_id is not None:
            raise ValueError("pad_id is for pack=False (packed blocks have no padding)")
        return None
    if pad_id is None:
        raise ValueError("pack=False needs pad_id, the token that pads rows to seq_len")
    return RowOptions(check_int(pad_id, "pad_id"), truncate)


MIN_MIXING_SHARE: Final = 2.0**-128
"""The smallest share of the total weight a mixed curriculum stage may have."""


def check_mixing_weights(stages: Sequence[str], weights: Sequence[object]) -> list[float]:
    """The stages' mixing weights as floats, each checked: a positive finite number (int or
    float, not bool) that a float holds, their sum finite, and each at least
    :data:`MIN_MIXING_SHARE` (2**-128) of the sum, so that the mixed order's keys stay finite
    and every stage keeps a non-zero share.

    Raises ValueError naming the stage and the weight for every bad case (inf, nan, 0,
    negative, a bool, a str, 10**400, weights whose sum overflows, 1e308 next to 1e-308).
    """
    values = []
    for stage, weight in zip(stages, weights, strict=True):
        value = math.nan
        if isinstance(weight, int | float) and not isinstance(weight, bool):
            try:
                value = float(weight)
            except OverflowError:
                raise ValueError(
                    f"Curriculum stage {stage!r} needs a positive finite weight, got "
                    f"{shown(weight)} (too large for a float)"
                ) from None
        if not math.isfinite(value) or value <= 0:
            raise ValueError(
                f"Curriculum stage {stage!r} needs a positive finite weight, got {shown(weight)}"
            )
        values.append(value)
    try:
        total = math.fsum(values)
    except OverflowError:  # "intermediate overflow in fsum"
        total = math.inf
    if not math.isfinite(total):
        largest = max(range(len(values)), key=values.__getitem__)
        raise ValueError(
            f"Curriculum stage {stages[largest]!r} has weight {values[largest]!r}: the weights "
            "sum beyond the largest float; scale them down"
        )
    for stage, value in zip(stages, values, strict=True):
        if value / total < MIN_MIXING_SHARE:
            raise ValueError(
                f"Curriculum stage {stage!r} has weight {value!r}, less than 2**-128 of the "
                f"weights' sum {total!r}: its share would vanish (leave the stage out instead)"
            )
    return values


def shown(weight: object) -> str:
    """A weight for an error message, bounded (an int of thousands of digits is not echoed)."""
    if isinstance(weight, int) and not isinstance(weight, bool) and weight.bit_length() > 64:
        return f"an int of {weight.bit_length()} bits"
    text = repr(weight)
    return text if len(text) <= 80 else text[:77] + "..."
