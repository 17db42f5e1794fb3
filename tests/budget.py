"""A work budget for tests: counts executed Python lines instead of reading a clock."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class OverBudget(BaseException):  # not an Exception: no handler in the code under test eats it
    pass


@contextmanager
def line_budget(lines: int = 20_000) -> Iterator[None]:
    """Fails once the code run inside executes more than ``lines`` Python lines: a check or a
    plan computation that grows with a hostile value (10^9 ranks, 10^12 batches) cannot finish
    inside it, while a bounded one takes a few thousand. No wall clock involved."""
    count = 0

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
            if count > lines:
                raise OverBudget(f"more than {lines} lines")
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        yield
    finally:
        sys.settrace(previous)
