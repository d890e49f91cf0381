"""What an emulator run measured: per job, the time from queued to a ready runner and whose time it was.

A job's wait is split at two points the timeline saw. The control plane's share runs from the
`queued` webhook until the instance is handed to the run (its record claimed, for a warm runner
from the pool, or created, for a cold one launched for it). The instance's share runs from there
until its runner listens (booting first, when cold). GitHub's share is the rest, until the runner
has taken the job. A runner counts as warm when its instance was launched before the job was
queued: it came from the pool.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from emulator.fake_github import FakeJob, GitHubState
from emulator.timeline import Happening, TimelineEvent
from runner_pool.domain.clock import Epoch
from runner_pool.domain.executions import instance_of_runner


class Kind(StrEnum):
    WARM = "warm"
    COLD = "cold"
    NONE = "no runner"


@dataclass(frozen=True)
class JobFigures:
    job: str
    """`<workflow> #<run id> / <job name>`."""
    kind: Kind
    conclusion: str
    instance_id: str | None = None
    ready_seconds: float | None = None
    """From queued to the job started on its runner."""
    control_plane_seconds: float | None = None
    instance_seconds: float | None = None
    github_seconds: float | None = None


def job_figures(events: Sequence[TimelineEvent], github: GitHubState) -> list[JobFigures]:
    with github.lock:
        jobs = sorted(github.jobs.values(), key=lambda j: (j.queued_at, j.job_id))
        workflows = {run.run_id: run.workflow for run in github.runs.values()}
    return [_figures(job, workflows[job.run_id], events) for job in jobs]


def _figures(job: FakeJob, workflow: str, events: Sequence[TimelineEvent]) -> JobFigures:
    name = f"{workflow} #{job.run_id} / {job.name}"
    conclusion = job.conclusion.value if job.conclusion else job.status.value
    instance_id = instance_of_runner(job.runner_name)
    if instance_id is None or job.started_at is None:
        return JobFigures(name, Kind.NONE, conclusion)
    own = [e for e in events if e.instance_id == instance_id]
    launched = next((e.at for e in own if e.happening is Happening.LAUNCHED), job.queued_at)
    kind = Kind.WARM if launched < job.queued_at else Kind.COLD
    handed_state = "claimed" if kind is Kind.WARM else "created"
    started = job.started_at
    handed = _last(own, Happening.STATE, handed_state, before=started, not_before=job.queued_at - 1)
    registered = _last(own, Happening.REGISTERED, job.labels[0] if job.labels else "", before=started + 0.5)
    figures = JobFigures(name, kind, conclusion, instance_id, started - job.queued_at)
    if handed is None or registered is None:
        return figures
    handed = max(handed, job.queued_at)
    registered = min(max(registered, handed), started)
    return JobFigures(
        name,
        kind,
        conclusion,
        instance_id,
        started - job.queued_at,
        handed - job.queued_at,
        registered - handed,
        started - registered,
    )


def _last(
    events: Iterable[TimelineEvent],
    happening: Happening,
    detail: str,
    *,
    before: Epoch,
    not_before: Epoch = 0.0,
) -> Epoch | None:
    """When the last such event happened within [not_before, before]; None if none did."""
    times = [
        e.at
        for e in events
        if e.happening is happening and e.detail == detail and not_before <= e.at <= before
    ]
    return max(times) if times else None


@dataclass(frozen=True)
class Spread:
    median: float
    p95: float
    count: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Spread | None:
        known = sorted(v for v in values if v is not None)
        if not known:
            return None
        p95 = known[min(len(known) - 1, round(0.95 * (len(known) - 1)))]
        return cls(statistics.median(known), p95, len(known))

    def __str__(self) -> str:
        return f"{self.median:.1f} s median, {self.p95:.1f} s p95 (of {self.count})"
