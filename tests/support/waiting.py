"""Waiting on a condition, never on a fixed sleep: the one poll loop the tests share."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest


def eventually(
    check: Callable[[], Any],
    what: str = "a condition",
    timeout: float = 10.0,
    every: float = 0.025,
    explain: Callable[[], str] | None = None,
) -> Any:
    """Poll `check` every `every` seconds until it returns something truthy, and return that; fail the test
    with `what` after `timeout`, and with what `explain` says then (computed only on that failure: a
    rare timeout under load says what the system was doing)."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            failure = f"timed out after {timeout:g} s waiting for {what}"
            pytest.fail(failure if explain is None else f"{failure}\n{_explained(explain)}")
        time.sleep(every)
    return result


def _explained(explain: Callable[[], str]) -> str:
    # A diagnosis that fails itself (local AWS stopping, say) must not hide the timeout it explains.
    try:
        return explain()
    except Exception as error:  # any failure of it is reported in its place
        return f"(no diagnosis: {type(error).__name__}: {error})"
