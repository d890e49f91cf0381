"""GitHub's hourly limit as every answer reports it (`x-ratelimit-*`), for the registration budget.

docs.github.com, "Rate limits for the REST API": "Checking the status of your rate limit" names the
headers; an installation has 5,000 requests an hour, more for a large one (up to 12,500).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping

from runner_pool.domain.registration_budget import HourlyQuota

PUBLISH_STEP = 0.01
"""Share of the hourly limit the remainder moves by before it is published again (50 of 5,000)."""


def hourly_quota(headers: Mapping[str, str]) -> HourlyQuota | None:
    """The REST API's hourly limit an answer reports (`x-ratelimit-resource: core`); None for an answer
    without it, or of another resource (search and GraphQL have their own limits)."""
    if headers.get("x-ratelimit-resource", "core") != "core":
        return None
    try:
        return HourlyQuota(
            limit=int(headers["x-ratelimit-limit"]),
            remaining=int(headers["x-ratelimit-remaining"]),
            reset_at=float(headers["x-ratelimit-reset"]),
        )
    except (KeyError, ValueError):
        return None


class HourlyWatch:
    """The last hourly figures read, passed on to `publish` (the shared budget) only when they moved by
    PUBLISH_STEP or the hour reset, so that no GitHub answer costs a write of its own."""

    def __init__(self, publish: Callable[[HourlyQuota], None] | None) -> None:
        self._publish = publish
        self._lock = threading.Lock()
        self.seen: HourlyQuota | None = None
        self._published: HourlyQuota | None = None

    def __call__(self, quota: HourlyQuota) -> None:
        with self._lock:
            self.seen = quota
            last = self._published
            due = (
                last is None
                or quota.reset_at != last.reset_at
                or last.remaining - quota.remaining >= (max(1, math.ceil(quota.limit * PUBLISH_STEP)))
            )
            if due:
                self._published = quota
        if due and self._publish is not None:
            self._publish(quota)
