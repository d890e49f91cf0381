"""What happened in an emulator run, in order: instances launched, booted, claimed, serving jobs, terminated.

Three sources feed it: the simulated instances (EC2 launches and terminations, the agents' own
account of registering and cleaning up), the state table's records (each state an instance's
record enters, seen by `RecordWatcher`), and the fake GitHub's jobs (queued, started on a runner,
completed). The chart and the demo's report read it afterwards.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from emulator.fake_github import FakeJob
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.clock import Epoch, SystemClock
from runner_pool.domain.executions import instance_of_runner


class Happening(StrEnum):
    LAUNCHED = "launched"
    """EC2 has the instance."""
    BOOTED = "booted"
    """Its agent started, after the boot delay."""
    STATE = "state"
    """Its record entered a state; the detail names it."""
    HEARD = "config heard"
    """Its agent read its runner config for the run key in the detail; `seconds`: how long the config
    had waited for it since the control plane stored it."""
    REGISTERED = "registered"
    """Its agent's runner listens for the run key in the detail."""
    CLEANED = "cleaned"
    """Its agent stopped the runner, cleaned up and gave its receipt."""
    CRASHED = "crashed"
    STOPPED = "stopped"
    """EC2 stopped it (the stopped tier): its OS shut down, its agent with it."""
    STARTED = "started"
    """EC2 started it again; its agent boots after the boot delay."""
    TERMINATED = "terminated"
    JOB_QUEUED = "job queued"
    JOB_STARTED = "job started"
    JOB_ENDED = "job ended"


@dataclass(frozen=True)
class TimelineEvent:
    at: Epoch
    happening: Happening
    instance_id: str | None = None
    job: str | None = None
    """`<run id>/<job name>` for job events."""
    detail: str = ""
    seconds: float | None = None
    """A duration the happening reports (HEARD's wait)."""


@dataclass
class Timeline:
    clock: SystemClock = field(default_factory=SystemClock)
    _events: list[TimelineEvent] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(
        self,
        happening: Happening,
        instance_id: str | None = None,
        *,
        job: str | None = None,
        detail: str = "",
        at: Epoch | None = None,
        seconds: float | None = None,
    ) -> TimelineEvent:
        event = TimelineEvent(
            self.clock.now() if at is None else at, happening, instance_id, job, detail, seconds
        )
        with self._lock:
            self._events.append(event)
        return event

    def events(self, jobs: Iterable[FakeJob] = ()) -> list[TimelineEvent]:
        """Every event so far, oldest first, with the queueing, start and end of `jobs` (as the fake
        GitHub saw them, on the instance that ran each)."""
        with self._lock:
            recorded = list(self._events)
        return sorted(recorded + [e for job in jobs for e in _job_events(job)], key=lambda e: e.at)

    def of(self, instance_id: str) -> list[TimelineEvent]:
        return [e for e in self.events() if e.instance_id == instance_id]

    def first(self, happening: Happening, **where: Any) -> TimelineEvent | None:
        return next(
            (
                e
                for e in self.events()
                if e.happening is happening and all(getattr(e, k) == v for k, v in where.items())
            ),
            None,
        )


def _job_events(job: FakeJob) -> list[TimelineEvent]:
    name = f"{job.run_id}/{job.name}"
    instance_id = instance_of_runner(job.runner_name)
    events = [TimelineEvent(job.queued_at, Happening.JOB_QUEUED, job=name, detail=" ".join(job.labels))]
    if job.started_at is not None and job.runner_name is not None:
        events.append(TimelineEvent(job.started_at, Happening.JOB_STARTED, instance_id, job=name))
    if job.completed_at is not None:
        outcome = job.conclusion.value if job.conclusion else ""
        events.append(
            TimelineEvent(job.completed_at, Happening.JOB_ENDED, instance_id, job=name, detail=outcome)
        )
    return events


EXPIRED = "expired"
"""The detail of a STATE event for a record whose threshold has passed (its state is kept)."""
TERMINATED_STATE = "terminated"


class RecordWatcher:
    """Looks at the live records every `period_seconds` and notes each state an instance's record enters.

    It reads through the state table's own sweep of live records (a few queries, no scan), so a
    record that leaves the sweep has been terminated. A state held for less than one period may be
    missed; the chart is a picture, not the accounting.
    """

    def __init__(self, table: StateTable, timeline: Timeline, period_seconds: float = 0.25) -> None:
        self._table = table
        self._timeline = timeline
        self._period = period_seconds
        self._seen: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="record-watcher", daemon=True)

    def start(self) -> RecordWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.look()

    def look(self) -> None:
        now = self._timeline.clock.now()
        current = {
            record.instance_id: EXPIRED if record.threshold_passed(now) else record.state.value
            for record in self._table.live()
        }
        gone = {instance_id: TERMINATED_STATE for instance_id in self._seen if instance_id not in current}
        for instance_id, state in (current | gone).items():
            if self._seen.get(instance_id) != state:
                self._seen[instance_id] = state
                self._timeline.record(Happening.STATE, instance_id, detail=state, at=now)

    def _watch(self) -> None:
        while not self._stop.wait(self._period):
            try:
                self.look()
            except Exception:  # noqa: S112 - a missed look only coarsens the picture
                continue
