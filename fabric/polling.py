"""Polling to a deadline: the one way fabriclab (and its tests) wait for something to become true.

Never `sleep(n)` and hope: poll a condition that is cheap to check, with a deadline, and fail with a
message that says what did not happen.
"""
from __future__ import annotations

import time
from typing import Callable, TypeVar

from fabric.errors import DeadlineError

T = TypeVar("T")


def wait_until(what: str, ready: Callable[[], T], timeout_s: float, interval_s: float = 0.05,
               clock: Callable[[], float] = time.monotonic) -> T:
    """Call `ready()` every `interval_s` until it returns something truthy, and return that value.
    Raise DeadlineError naming `what` once `timeout_s` has passed (the last call's value included)."""
    deadline = clock() + timeout_s
    while True:
        value = ready()
        if value:
            return value
        if clock() >= deadline:
            raise DeadlineError(f"timed out after {timeout_s:g} s waiting for {what} (last value: {value!r})")
        time.sleep(interval_s)


def waited_s(what: str, ready: Callable[[], object], timeout_s: float, interval_s: float = 0.05) -> float:
    """`wait_until`, returning the seconds it took instead of the value."""
    t0 = time.monotonic()
    wait_until(what, ready, timeout_s, interval_s)
    return time.monotonic() - t0
