"""Calls run at once, each on a thread of its own: the one way the race tests start their contenders."""

from __future__ import annotations

import threading
from collections.abc import Callable


def at_once(*calls: Callable[[], object]) -> None:
    """Start every call on a thread of its own, then wait for all of them to end."""
    threads = [threading.Thread(target=call) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
