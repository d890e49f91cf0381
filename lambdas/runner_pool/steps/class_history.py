"""Noting the facts adaptive sizing reads (domain/class_history.py) where they happen: a note that fails is
logged and counted, never fails the dispatch, provision or refresh it describes; and reading them back
into what each class should hold (`sized`), for refresh."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from runner_pool.domain.class_history import ClassHistory, Entry, Fact, demand_of
from runner_pool.domain.clock import Clock, Epoch
from runner_pool.domain.config import PoolSizing, StackConfig
from runner_pool.domain.demand import JobQueued
from runner_pool.domain.run_keys import RunKey
from runner_pool.domain.sizing import SEASON_HOURS, Holding, pool_size
from runner_pool.observability import count, logger


class HistoryNotes:
    def __init__(self, history: ClassHistory, config: StackConfig, clock: Clock) -> None:
        self._history = history
        self._config = config
        self._clock = clock

    def arrivals(self, jobs: Iterable[JobQueued]) -> None:
        """Each job arrived now, in its class (one write per class)."""
        now = self._clock.now()
        by_class: dict[str, list[Entry]] = defaultdict(list)
        for job in jobs:
            try:
                resource_class = RunKey.parse(job.run_key).resolve(self._config).resource_class
            except ValueError:
                continue  # a label the dispatch refuses is no class's demand
            by_class[resource_class].append(Entry(str(job.job_id), now))
        for resource_class, entries in by_class.items():
            self._note(Fact.ARRIVAL, resource_class, entries)

    def boot(self, fact: Fact, resource_class: str, instance_id: str, seconds: float) -> None:
        """An instance of the class took `seconds` from its launch (or start) to ready."""
        if seconds >= 0:
            self._note(fact, resource_class, [Entry(instance_id, seconds)])

    def reused(self, resource_class: str, instance_id: str, jobs_served: int) -> None:
        """A job of the class was served warm by an instance on its `jobs_served`th hand-off (above 1: it had
        served before)."""
        if jobs_served > 1:
            self._note(Fact.REUSE, resource_class, [Entry(f"{instance_id}#{jobs_served}", self._clock.now())])

    def _note(self, fact: Fact, resource_class: str, entries: list[Entry]) -> None:
        try:
            self._history.note(fact, resource_class, entries, self._clock.now())
        except Exception:
            count("SizingHistoryNotesFailed")
            logger.warning(
                "sizing history not noted; adaptive sizing reads one fact fewer",
                fact=fact.value,
                resource_class=resource_class,
                exc_info=True,
            )


def sized(history: ClassHistory | None, config: StackConfig, now: Epoch) -> dict[str, Holding]:
    """Per class, what adaptive sizing holds now (domain/sizing.py), the schedule in force its floor;
    empty on the schedule (or without a history). A class whose history cannot be read keeps the
    schedule, logged."""
    pool = config.pool
    if pool.sizing is not PoolSizing.ADAPTIVE or history is None:
        return {}
    horizon = pool.sizing_horizon_minutes * 60.0
    refresh_seconds = config.refresh_rate_minutes * 60.0
    # The rule reads the arrivals of two leads before the horizon too (a lead's count at each moment, for
    # each moment of the lead it holds its answer over), and those of SEASON_HOURS hours back; a lead is
    # at most a launch's created threshold (past it the launch is expired) and a refresh period. The reuse
    # rate is the horizon's.
    lead = config.timeouts.created_threshold_seconds + refresh_seconds
    since = now - max(horizon + 2 * lead, SEASON_HOURS * 3600.0)
    holdings: dict[str, Holding] = {}
    for name in config.resource_classes:
        floor = Holding(config.warm_minimum(name, now), config.stopped_minimum(name, now))
        ceiling = Holding(max(pool.hot_maximum, floor.hot), pool.stopped_maximum)
        try:
            demand = demand_of(history.read(name, since), refresh_seconds, rate_since=now - horizon)
        except Exception:
            count("SizingHistoryUnread")
            logger.exception("sizing history not read; the class keeps its schedule", resource_class=name)
            demand = None
        holdings[name] = pool_size(
            demand, pool.target_wait_seconds, now, floor, ceiling, horizon_seconds=horizon
        )
    return holdings
