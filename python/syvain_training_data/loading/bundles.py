"""Bundles: a DataLoader worker sends its batches several at a time.

Every DataLoader item costs a request, a pipe message and wake-ups in both processes, more than
building a training step's batch of tokens. So the token and column loaders make each item a
bundle of batches, and the loader hands the batches out again one worker at a time in turn, the
order a DataLoader gives batches sent one by one: the stream, and where a state resumes it, do
not depend on the bundle size.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["BUNDLE_BATCHES", "BUNDLE_BYTES", "Bundle", "as_is", "bundled", "in_turn"]

# A bundle closes at about this many bytes of batches. A worker works at most prefetch_factor
# bundles ahead of the training loop, so small bundles leave it waiting for the next request:
# bundles of a few MiB keep workers about as fast as no workers (benchmarks/tokens_loader.py).
BUNDLE_BYTES = 4 << 20
# ... and at this many batches: small batches still reach the training loop early.
BUNDLE_BATCHES = 32
# (worker, whether it is the worker's last, its batches): one DataLoader item
Bundle = tuple[int, bool, list[Any]]


def bundled(
    batches: Iterator[Any],
    worker: int,
    size: int,
    weigh: Callable[[Any], int] | None = None,
) -> Iterator[Bundle]:
    """A worker's batches in bundles, the last (maybe empty) marked as such. The first holds
    one batch and each next one twice as many, up to ``size`` (fewer once ``weigh``, a batch's
    bytes, sums to BUNDLE_BYTES): the first batches reach the training loop at once, later
    ones in bundles that keep the worker ahead."""
    bundle: list[Any] = []
    weight = 0
    limit = 1
    for batch in batches:
        bundle.append(batch)
        if weigh is not None:
            weight += weigh(batch)
        if len(bundle) >= min(limit, size) or weight >= BUNDLE_BYTES:
            yield worker, False, bundle
            bundle, weight = [], 0
            limit *= 2
    yield worker, True, bundle


def in_turn(bundles: Iterator[Bundle], workers: int) -> Iterator[Any]:
    """The bundles' batches in the order a DataLoader hands out batches sent one by one: one
    from each worker in turn, passing over workers that are done."""
    queues: list[collections.deque[Any]] = [collections.deque() for _ in range(workers)]
    ended = [False] * workers
    turn = 0
    while True:
        if queues[turn]:
            yield queues[turn].popleft()
        elif not ended[turn]:
            bundle = next(bundles, None)
            if bundle is None:  # every worker sends a last bundle; this is only a guard
                ended = [True] * workers
                continue
            worker, last, batches = bundle
            queues[worker].extend(batches)
            ended[worker] = last
            continue
        live = [w for w in range(workers) if queues[w] or not ended[w]]
        if not live:
            return
        turn = min(live, key=lambda w: (w - turn - 1) % workers)


def as_is(item: Any) -> Any:
    """The collate function of a loader whose dataset yields bundles."""
    return item
