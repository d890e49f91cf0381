"""Time as the product sees it: epoch seconds from a clock that tests and the emulator can steer."""

from __future__ import annotations

import threading
import time
from typing import Protocol

Epoch = float
"""Seconds since the Unix epoch; the unit of every threshold and timestamp in the records."""


class Clock(Protocol):
    def now(self) -> Epoch: ...


class SystemClock:
    def now(self) -> Epoch:
        return time.time()


class ManualClock:
    """A clock that only moves when told to; safe to read from many threads."""

    def __init__(self, start: Epoch = 1_800_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> Epoch:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> Epoch:
        if seconds < 0:
            raise ValueError("a clock never moves backwards")
        with self._lock:
            self._now += seconds
            return self._now
