"""Noting the facts adaptive sizing reads (domain/class_history.py) where they happen: a note that fails is
logged and counted, never fails the dispatch, provision or refresh it describes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from runner_pool.domain.class_history import ClassHistory, Entry, Fact
from runner_pool.domain.clock import Clock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.demand import JobQueued
from runner_pool.domain.run_keys import RunKey
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
