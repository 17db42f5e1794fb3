"""Testing seams. Not for production use: users get the SPEC section 4 constants.

``storage_policy(...)`` shrinks the retry budget and timeouts of the native storage layer for the
duration of a ``with`` block, e.g. so that an unreachable endpoint gives up in a second::

    with storage_policy(max_attempts=3, window_s=5, backoff_base_s=0.01, backoff_cap_s=0.05):
        ...

The policy is process-wide and is inherited by forked children.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from syvain_training_data import _native

SPEC_POLICY = {
    "max_attempts": 64,
    "window_s": 900.0,
    "backoff_base_s": 1.0,
    "backoff_cap_s": 30.0,
    "connect_timeout_s": 10.0,
    "read_inactivity_timeout_s": 60.0,
    "request_timeout_s": 600.0,
    "stream_response_deadline_s": 60.0,
}


@contextmanager
def storage_policy(**overrides: float) -> Iterator[dict[str, float]]:
    """Applies the given policy fields (names as in ``SPEC_POLICY``) and restores the previous
    policy afterwards. Unknown names raise TypeError."""
    unknown = set(overrides) - set(SPEC_POLICY)
    if unknown:
        raise TypeError(f"Unknown storage policy fields: {', '.join(sorted(unknown))}")
    previous = _native.get_storage_policy()
    policy = {**previous, **overrides}
    _apply(policy)
    try:
        yield policy
    finally:
        _apply(previous)


def _apply(policy: dict[str, float]) -> None:
    _native.set_storage_policy(
        max_attempts=int(policy["max_attempts"]),
        window_s=policy["window_s"],
        backoff_base_s=policy["backoff_base_s"],
        backoff_cap_s=policy["backoff_cap_s"],
        connect_timeout_s=policy["connect_timeout_s"],
        read_inactivity_timeout_s=policy["read_inactivity_timeout_s"],
        request_timeout_s=policy["request_timeout_s"],
        stream_response_deadline_s=policy["stream_response_deadline_s"],
    )
