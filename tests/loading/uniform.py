"""What a uniform permutation would give, for mixing yardsticks (tests and benchmarks/mix.py)."""

from __future__ import annotations

import math


def expected_distinct(groups: int, per_group: int, draws: int) -> float:
    """Distinct groups among ``draws`` records drawn without replacement from ``groups`` groups
    of ``per_group`` records each (a uniform permutation's batch): exact, not sampled."""
    total = groups * per_group
    # P(a given group is missed) = C(total - per_group, draws) / C(total, draws).
    missed = math.exp(
        math.lgamma(total - per_group + 1)
        - math.lgamma(total - per_group - draws + 1)
        - math.lgamma(total + 1)
        + math.lgamma(total - draws + 1)
    )
    return groups * (1 - missed)
