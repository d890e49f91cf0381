"""The registration budget: a token bucket that keeps JIT runner registrations under GitHub's limits.

GitHub's secondary rate limits allow no more than 900 points a minute per REST endpoint, and a POST
costs 5 points, so one App can register about 180 JIT runners a minute (docs.github.com, "Rate
limits for the REST API", "About secondary rate limits" and "Calculating points for the secondary
rate limit"). Every claim worker and creation of every provision registers runners at the same
endpoint, so a burst of demand would overrun that and be answered 403/429 with `retry-after`. One
bucket per App, shared by all of them, hands out tokens at a steady rate below GitHub's and lets a
short burst through: a burst slows down instead of failing. When GitHub answers with a rate limit
anyway (another tool of the same App, a limit lower than documented), the bucket is held off until
GitHub's `retry-after` has passed, so nobody keeps asking ("Continuing to make requests while you
are rate limited may result in the banning of your integration", same page).

GitHub's primary limit is hourly: an App's installation may make 5,000 REST requests an hour, more for
an organisation with more than 20 users or repositories (50 an hour each, up to 12,500), and every
answer says what is left in `x-ratelimit-remaining` and when the hour resets in `x-ratelimit-reset`
(same page, "About primary rate limits" and "Checking the status of your rate limit"). 180
registrations a minute would be 10,800 an hour, so the bucket also carries the last hourly figures
any process of ours read (HourlyQuota): a take never grants more registrations than the hour has left
above REGISTRATION_FLOOR, and each grant counts down the remainder until GitHub's next answer says
better. Refresh's reads (runner lists, job lists) stop earlier, at REFRESH_FLOOR, so that what is
left of the hour goes to registrations, which serve jobs.

The arithmetic lives here; the bucket's state is one item that an adapter moves with conditional
writes (adapters/registration_budget.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from runner_pool.domain.clock import Epoch

GITHUB_REGISTRATIONS_PER_MINUTE = 180
"""900 points a minute per endpoint at 5 points a POST: the ceiling the documented limits allow."""


GITHUB_REQUESTS_PER_HOUR = 5000
"""An installation's hourly minimum (larger installations are told more in `x-ratelimit-limit`)."""
REGISTRATION_FLOOR = 0.02
"""Share of the hourly limit registrations leave unused: for releases' deletions and the doctor."""
REFRESH_FLOOR = 0.25
"""Share of the hourly limit below which refresh reads GitHub no more: the rest is registrations'."""
RUN_READ_FLOOR = 0.10
"""Share of the hourly limit below which the dispatcher no longer asks GitHub about a run whose
`requested` delivery it has not seen (one read per run attempt): its jobs are then served single use,
and the rest of the hour is registrations'. Above refresh's floor, because a run's level decides how
its jobs are served now; below registrations', which serve them."""


@dataclass(frozen=True)
class HourlyQuota:
    """GitHub's primary limit as last read from an answer: `remaining` of `limit` until `reset_at`."""

    limit: int
    remaining: int
    reset_at: Epoch

    def left_above(self, floor: float, now: Epoch) -> int:
        """Requests that may still be made this hour keeping `floor` (a share of the limit) unused. Once
        `reset_at` has passed the hour has begun anew: the whole limit, less the floor."""
        kept = math.ceil(self.limit * floor)
        remaining = self.limit if now >= self.reset_at else self.remaining
        return max(0, remaining - kept)

    def spent(self, count: int) -> HourlyQuota:
        return HourlyQuota(self.limit, max(0, self.remaining - count), self.reset_at)


@dataclass(frozen=True)
class Bucket:
    """The bucket as last written: `tokens` at time `at`, and no registration before `held_until`;
    `hourly`, GitHub's hourly remainder as last read (None: never read yet)."""

    tokens: float
    at: Epoch
    held_until: Epoch = 0.0
    hourly: HourlyQuota | None = None

    def refilled(self, now: Epoch, per_second: float, capacity: float) -> float:
        """Tokens available at `now`: what was left plus what the rate added since, up to capacity."""
        return min(capacity, self.tokens + max(0.0, now - self.at) * per_second)


@dataclass(frozen=True)
class Grant:
    """What one take got: `granted` tokens now; if fewer than asked, how long until the next is due."""

    granted: int
    wait_seconds: int = 0

    @property
    def refused(self) -> bool:
        return self.granted == 0


def take(
    bucket: Bucket | None, wanted: int, now: Epoch, per_second: float, capacity: float
) -> tuple[Grant, Bucket]:
    """Take up to `wanted` whole tokens from `bucket` (None: a full bucket, never used); the grant and
    the bucket to write back. A held-off bucket grants nothing until its hold has passed."""
    if wanted < 1:
        raise ValueError(f"take at least one token, not {wanted}")
    current = bucket or Bucket(tokens=capacity, at=now)
    if now < current.held_until:
        return Grant(0, wait_seconds(current.held_until - now)), current
    hourly = current.hourly
    hour_allows = wanted if hourly is None else hourly.left_above(REGISTRATION_FLOOR, now)
    if hour_allows == 0 and hourly is not None:
        # The hour's remainder is spent: nothing until GitHub resets it.
        return Grant(0, wait_seconds(hourly.reset_at - now)), current
    available = current.refilled(now, per_second, capacity)
    granted = min(wanted, math.floor(available), hour_allows)
    left = available - granted
    wait = 0 if granted == wanted else wait_seconds((1.0 - (left % 1.0)) / per_second)
    after = None if hourly is None else hourly.spent(granted)
    return Grant(granted, wait), Bucket(tokens=left, at=now, held_until=current.held_until, hourly=after)


def wait_seconds(seconds: float) -> int:
    """Step Functions' Wait takes whole seconds; at least one, so a waiting worker never spins."""
    return max(1, math.ceil(seconds))


class RegistrationBudget(Protocol):
    """The App's shared budget of JIT registrations (DynamoDB in production)."""

    def take(self, wanted: int) -> Grant:
        """Up to `wanted` registrations may be made now."""
        ...

    def give_back(self, count: int) -> None:
        """Tokens taken but not used (a claim worker found no instance to register a runner for)."""
        ...

    def hold_off(self, seconds: float) -> None:
        """GitHub answered with a rate limit: nobody registers for `seconds`."""
        ...

    def hourly(self) -> HourlyQuota | None:
        """GitHub's hourly remainder as last read by any of our processes (None: never read)."""
        ...
