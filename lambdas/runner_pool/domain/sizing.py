"""How many hot and stopped instances a class should hold now, from its own recent demand and boot times.

The reasoning is an inventory one: the pool is stock, a job takes one instance from it, and each instance
taken is replaced by a launch that is ready a lead time later (at most a refresh period until refresh
sees the gap, then the launch's own measured launch -> ready). The instances being replaced at a moment
are the jobs that took one within the last lead time: by Little's law their mean is the arrival rate
times the lead time, and by Palm's theorem, for arrivals that come independently (Poisson), their number
is Poisson with that mean whatever the lead time's spread. A job finds an instance waiting when fewer
than the pool's size are being replaced as it comes, and arrivals that come independently see the pool
as it is on average over time (PASTA), so a pool of `n` serves a share of jobs equal to the share of
time in which at most `n` jobs arrived within one lead time. The rule reads that share off the class's
recent arrivals themselves, over the last hour (`HORIZON_SECONDS`), rather than assuming a rate: the count of
arrivals in the lead time before each moment of the horizon, and the smallest pool that covers a share of
moments.

Which tier holds the stock follows from the target wait (`pool.target_wait_seconds`, a p95): if a launch
is ready within it (launch -> ready), no pool is needed; if a stopped instance is (start -> ready), the
stopped tier alone holds the target's share, at an EBS volume's price; otherwise both do, split by what
each costs. A hot instance is billed every second it waits, a stopped one only its volume (about a
twentieth of a hot one's price for the default class), so the hot tier covers HOT_SHARE of the moments
and the stopped tier stands behind it for nearly all the rest (BEHIND_SHARE): a job the hot tier misses
waits a start rather than a launch. Only the hot tier counts the reuse supply: a released instance goes
back to the pool and replaces the one its job took without a launch, so only the share of jobs whose
instance does not come back (1 - the reuse rate) counts against it; the stopped tier counts every
arrival, as a matrix takes its instances at once and none of theirs comes back within a start.

Where a start is slower than the target (as the boot model's is: about 17 s at the median against 15),
the jobs the hot tier misses wait longer than the target, so HOT_SHARE decides the p95: the day trace
(bench/day_trace.py) shows what it buys and costs. A matrix's jobs come together, not independently: the
share of time a burst fills is smaller than the share of jobs in it, so the hot tier covers bursts only
as far as they recur within the horizon, and the stopped tier catches the rest of them.

Scheduled workflows (`on: schedule`, cron) come at the same minutes of every hour, in bursts the horizon
sees only once: the rule looks at the window ahead (a lead time and a refresh period) in each of the last
SEASON_HOURS hours, and if every one of them had arrivals in it, holds the fewest of them hot ahead of
the hour's repeat. Arrivals that come independently seldom recur in all of them at once.

The answer grows at once and shrinks deliberately: it is the largest the rule gave at any refresh within
the last lead time, so an instance is never ended sooner than a launch could bring it back (ending it and
launching its replacement would pay a boot for nothing). The weekly schedule in force bounds the answer:
its value is the floor, and the ceiling (the caller's: `pool.hot_maximum`, `pool.stopped_maximum`) the
most. A stack that has not yet watched its class for a whole horizon has no history to read: the answer
is the schedule's. It is one pure function; refresh and the day trace (bench/day_trace.py) both call it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

from runner_pool.domain.clock import Epoch

HORIZON_SECONDS = 3600.0
"""How far back the rule reads a class's arrivals: an hour holds dozens of lead times, and on the day
trace (bench/day_trace.py) it served more jobs warm, at a lower cost, than half an hour, which forgets
a burst sooner than it recurs."""
TARGET_SHARE = 0.95
"""The share of jobs that must wait no longer than the target: `pool.target_wait_seconds` is a p95."""
HOT_SHARE = 0.86
"""The share of moments the hot tier covers when a start is slower than the target. Each point of it is
dear: on the day trace, the hot tier's idle time is most of what the pool costs, and covering 0.86 of the
moments instead of 0.95 brought the working day from 1.39x to 1.25x no pool's cost per job at a p50 of
7.9 s; 0.87 went past 1.25x (bench/day_trace.py, `day_trace_adaptive_*`)."""
SEASON_HOURS = 3
"""How many past hours must each have had arrivals in the window ahead for the rule to hold them hot: on
the storm trace (hourly schedules day and night) three took its p50 from 12.9 s to 8.8 s at 1.35x instead
of 1.32x, and the working day stayed within 1.25x (two: 1.27x)."""
BEHIND_SHARE = 1.0 - (1.0 - TARGET_SHARE) ** 2
"""The share of moments the hot and stopped tiers cover together: the stopped tier catches the target's
share of what the hot one misses."""


@dataclass(frozen=True)
class Holding:
    """Instances a class holds, or should: idle and running (hot), and stopped."""

    hot: int = 0
    stopped: int = 0

    def within(self, floor: Holding, ceiling: Holding | None) -> Holding:
        """This holding kept at or above `floor` and, where the floor allows, at or below `ceiling`."""
        if ceiling is None:
            return Holding(max(self.hot, floor.hot), max(self.stopped, floor.stopped))
        return Holding(
            max(floor.hot, min(self.hot, ceiling.hot)),
            max(floor.stopped, min(self.stopped, ceiling.stopped)),
        )


@dataclass(frozen=True)
class Demand:
    """What the stack has recorded of a class, as the rule needs it."""

    arrivals: Sequence[Epoch]
    """When its recent jobs were queued (any order): the rule reads those of the horizon (and two lead times
    before it), and those of the same minutes SEASON_HOURS hours back."""
    watched_since: Epoch
    """Since when the stack has recorded its arrivals (its deployment, or its oldest record kept)."""
    reuse_rate: float
    """The share of its recent jobs whose instance went back to the pool after them (0 to 1)."""
    launch_seconds: float
    """Launch -> ready of its instances, as measured (a high percentile of the recent launches)."""
    start_seconds: float
    """Start -> ready of its stopped instances, as measured."""
    refresh_seconds: float
    """The refresh period: how long a taken instance may wait for refresh to see the gap it left."""


def pool_size(
    demand: Demand | None,
    target_wait_seconds: float,
    now: Epoch,
    floor: Holding,
    ceiling: Holding | None = None,
    *,
    horizon_seconds: float = HORIZON_SECONDS,
) -> Holding:
    """The hot and stopped instances a class should hold at `now` to keep its jobs' p95 wait within
    `target_wait_seconds`, bounded by the schedule's `floor` and `ceiling` (module docstring), reading the
    arrivals of the last `horizon_seconds`. With no `demand`, or one watched for less than a horizon, the
    floor (the schedule)."""
    if demand is None or now - demand.watched_since < horizon_seconds:
        return floor.within(floor, ceiling)
    if demand.launch_seconds <= target_wait_seconds:
        return Holding().within(floor, ceiling)
    lead = demand.launch_seconds + demand.refresh_seconds
    replaced = 1.0 - min(1.0, max(0.0, demand.reuse_rate))
    recent = sorted(at for at in demand.arrivals if now - horizon_seconds - 2 * lead < at <= now)
    stopped_only = demand.start_seconds <= target_wait_seconds
    hot = together = 0
    # Grow at once, shrink only once a lower need has lasted a lead time: the largest at each refresh since.
    period = max(1.0, demand.refresh_seconds)
    for moment in (now - back * period for back in range(math.ceil(lead / period))):
        arrived = recent[: bisect.bisect_right(recent, moment)]
        every = _Covering(arrived, lead, 1.0, moment - horizon_seconds, moment)
        if stopped_only:
            together = max(together, every.size(TARGET_SHARE))
            continue
        hot = max(hot, _Covering(arrived, lead, replaced, moment - horizon_seconds, moment).size(HOT_SHARE))
        together = max(together, every.size(BEHIND_SHARE))
    if not stopped_only:
        ahead = _recurring(demand.arrivals, now, lead + demand.refresh_seconds)
        hot, together = max(hot, ahead), max(together, ahead)
    return Holding(hot, max(0, together - hot)).within(floor, ceiling)


def _recurring(arrivals: Sequence[Epoch], now: Epoch, window: float) -> int:
    """The fewest arrivals in [now, now + `window`) shifted back by each of the last SEASON_HOURS hours."""
    return min(
        sum(1 for at in arrivals if now - back * 3600.0 <= at < now - back * 3600.0 + window)
        for back in range(1, SEASON_HOURS + 1)
    )


@dataclass(frozen=True)
class _Covering:
    """The instances being replaced at each moment of [start, end): `replaced` times the arrivals within
    `lead` before it."""

    arrivals: Sequence[Epoch]
    lead: float
    replaced: float
    start: Epoch
    end: Epoch

    def size(self, share: float) -> int:
        """The smallest pool that at least `share` of the moments find with no more being replaced than it
        holds."""
        if self.end <= self.start:
            return 0
        needed = sorted(self._levels(), key=lambda level: level[0])
        covered = 0.0
        for count, seconds in needed:
            covered += seconds
            if covered >= share * (self.end - self.start) - 1e-9:
                return math.ceil(self.replaced * count - 1e-9)
        return math.ceil(self.replaced * needed[-1][0] - 1e-9) if needed else 0

    def _levels(self) -> list[tuple[int, float]]:
        """(arrivals within the lead, seconds of [start, end) at that count), piece by piece."""
        changes = sorted([(at, 1) for at in self.arrivals] + [(at + self.lead, -1) for at in self.arrivals])
        level, moment, pieces = 0, self.start, []
        for at, step in changes:
            if at > moment:
                piece_end = min(at, self.end)
                if piece_end > moment:
                    pieces.append((level, piece_end - moment))
                moment = max(moment, min(at, self.end))
            level += step
        if self.end > moment:
            pieces.append((level, self.end - moment))
        return pieces
