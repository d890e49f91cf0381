"""What the stack records of each resource class for adaptive sizing, and how refresh reads it into the
sizing rule's input (domain/sizing.py `Demand`).

Four facts, each written where it happens: a job's arrival (the dispatcher, when it takes the job's
`queued` delivery), an instance's launch -> ready (creation's fleet validation for a job's launch,
refresh's admission for the pool's), a stopped instance's start -> ready (its claim worker), and a job
served warm by an instance that had served before (its claim worker: the reuse the rule counts on, as
the day trace measures it). Each is an entry keyed by its job's or instance's id (an instance's reuse by
the hand-off it was), so a write repeated by a retried Lambda counts once: the reading keeps one entry
per id (the earliest arrival; any one boot, the same figure).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from runner_pool.domain.clock import Epoch
from runner_pool.domain.sizing import Demand

MEASURED = 50
"""How many of a class's latest launches (and starts) its boot time is the p95 of: enough for a p95 to
mean something, few enough to follow a change of image or instance type within a day's boots."""
BOOT_PERCENTILE = 0.95
BOOT_RETENTION_SECONDS = 24 * 3600.0
"""How long a boot is remembered: a class whose pool served every job warm for hours launches nothing to
measure, and a quiet night must not forget what a launch takes."""


class Fact(StrEnum):
    ARRIVAL = "arrival"
    LAUNCH = "launch"
    START = "start"
    REUSE = "reuse"


@dataclass(frozen=True)
class Entry:
    """One recorded fact: whose (a job's or an instance's id), and its figure (when the job arrived, or
    how many seconds the boot took)."""

    key: str
    value: float


@dataclass(frozen=True)
class ClassRecord:
    """A class's record as read: its arrivals and reuses since the time asked (any order), its latest
    launches and starts (newest first), and since when the stack has watched it."""

    arrivals: Sequence[Entry]
    launches: Sequence[Entry]
    starts: Sequence[Entry]
    watched_since: Epoch
    reuses: Sequence[Entry] = ()


class ClassHistory(Protocol):
    def note(self, fact: Fact, resource_class: str, entries: Collection[Entry], at: Epoch) -> None:
        """Add `entries` to the class's record of `fact`, in the minute of `at`; an entry noted again is
        no new fact."""
        ...

    def read(self, resource_class: str, arrivals_since: Epoch) -> ClassRecord:
        """The class's record, its arrivals and reuses from `arrivals_since` on; the first read of a class
        starts its watch."""
        ...


def demand_of(record: ClassRecord, refresh_seconds: float, rate_since: Epoch = -math.inf) -> Demand | None:
    """The rule's input from a class's record: its arrivals (each job once, at its earliest), the share
    of those since `rate_since` served by an instance that had served before (the reuse rate), and the p95
    of its latest MEASURED launches and starts (a start taken to be as slow as a launch until one is
    measured). None while no launch has been measured: the rule then keeps the schedule."""
    launches = _latest(record.launches)
    if not launches:
        return None
    launch = _percentile(launches)
    starts = _latest(record.starts)
    arrivals = _earliest(record.arrivals)
    reuses = len({entry.key for entry in record.reuses if entry.value >= rate_since})
    counted = sum(1 for at in arrivals.values() if at >= rate_since)
    return Demand(
        arrivals=sorted(arrivals.values()),
        watched_since=record.watched_since,
        reuse_rate=min(1.0, reuses / counted) if counted else 0.0,
        launch_seconds=launch,
        start_seconds=_percentile(starts) if starts else launch,
        refresh_seconds=refresh_seconds,
    )


def _earliest(entries: Iterable[Entry]) -> dict[str, float]:
    first: dict[str, float] = {}
    for entry in entries:
        first[entry.key] = min(entry.value, first.get(entry.key, math.inf))
    return first


def _latest(entries: Sequence[Entry]) -> list[float]:
    """The figures of the first MEASURED distinct ids of `entries` (newest first)."""
    seen: dict[str, float] = {}
    for entry in entries:
        if len(seen) == MEASURED:
            break
        seen.setdefault(entry.key, entry.value)
    return list(seen.values())


def _percentile(samples: list[float]) -> float:
    """BOOT_PERCENTILE of `samples` by nearest rank."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, math.ceil(BOOT_PERCENTILE * len(ordered)) - 1)]
