"""Waiting on a condition, never on a fixed sleep: the one poll loop the tests share."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest


def eventually(
    check: Callable[[], Any], what: str = "a condition", timeout: float = 10.0, every: float = 0.025
) -> Any:
    """Poll `check` every `every` seconds until it returns something truthy, and return that; fail the test
    with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)
    return result
