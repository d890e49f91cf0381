"""Which of several GitHub Apps a registration goes through (the Apps themselves: domain/github_apps.py).

Every App keeps its own budget (domain/registration_budget.py), and a registration goes through the App
with the most of it left now: the load spreads by what each has, not in turn, so an App another tool
also uses, or one GitHub held off, is asked less. An App GitHub refuses a token is left out a while.
"""

from __future__ import annotations

from collections.abc import Mapping

from runner_pool.domain.clock import Epoch
from runner_pool.domain.registration_budget import REGISTRATION_FLOOR, Bucket
from runner_pool.domain.runners import GitHubError


def with_most_left(left: Mapping[str, float], skipped: frozenset[str] = frozenset()) -> str | None:
    """The App with the most registrations left now, skipping `skipped` (Apps found faulty); ties go to
    the App listed first. None when every App is skipped."""
    usable = [(-amount, order, app) for order, (app, amount) in enumerate(left.items()) if app not in skipped]
    return min(usable)[2] if usable else None


SKIP_SECONDS = 300.0
"""How long an App found unusable is left out before it is tried again: a key replaced, an App installed
again, are an operator's fixes of minutes."""


class AppUnusableError(GitHubError):
    """GitHub refused the App's token itself: its key is wrong (401) or its installation is gone (404).
    Nothing the App does can succeed until an operator fixes it, so it is skipped, never retried at once."""


def registrations_left(bucket: Bucket, now: Epoch, per_second: float, capacity: float) -> float:
    """What an App's bucket would grant now: none while held off, else its tokens within the hour's
    remainder (domain/registration_budget.py `take`)."""
    if now < bucket.held_until:
        return 0.0
    left = bucket.refilled(now, per_second, capacity)
    if bucket.hourly is not None:
        left = min(left, float(bucket.hourly.left_above(REGISTRATION_FLOOR, now)))
    return left
