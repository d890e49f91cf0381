"""Re-running a run's failed jobs once, when one failed because EC2 interrupted the spot instance it ran on.

GitHub re-runs "all of the failed jobs and their dependent jobs in a workflow run" as a new attempt of the
same run (`POST /repos/{owner}/{repo}/actions/runs/{run_id}/rerun-failed-jobs`, docs.github.com, "REST API
endpoints for workflow runs", "Re-run failed jobs from a workflow run"); an App needs the `actions`
repository permission at `write` for it. A run can be re-run at most 50 times, and only a completed one
(docs.github.com, "Re-running workflows and jobs").

`decide` is the rule, over what GitHub says of the run now and what this stack asked before:

- only a run that completed as failed: a cancelled run was stopped by someone, on purpose;
- only its latest attempt: a later one means someone (a person, or this stack) re-ran it already;
- once per attempt, and never the attempt this stack's own re-run made: its interruption is not re-run
  again, so a class that keeps being interrupted costs one re-run per run, not a loop;
- not at all when `fleet.rerun_interrupted_jobs` is off.

The attempt a re-run makes is served on-demand for the label sets whose jobs were interrupted, whatever
their `usage=` says (`on_demand_for`): a job interrupted once is not put back on the market that took it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Verdict(StrEnum):
    RERUN = "rerun"
    OFF = "off"
    NOT_FAILED = "not-failed"
    CANCELLED = "cancelled"
    NOT_LATEST = "not-latest"
    OUR_RERUN = "our-rerun"
    ASKED = "asked"


@dataclass(frozen=True)
class RunNow:
    """What GitHub says of the run at the time of deciding (GET .../actions/runs/{run_id})."""

    status: str
    """`completed`, or one of the states of a run under way."""
    conclusion: str | None
    """`failure`, `cancelled`, `success` ... once completed."""
    latest_attempt: int
    """The run's `run_attempt`: its latest attempt."""


def marker_name(repository: str, run_id: int, attempt: int) -> str:
    """The state table marker (StateTable.move_marker) that this stack asked to re-run that attempt."""
    return f"rerun#{repository}#{run_id}#{attempt}"


def decide(
    *, enabled: bool, attempt: int, run: RunNow, asked_for_previous: bool, asked_for_this: bool
) -> tuple[Verdict, str]:
    """Whether to re-run the failed jobs of `attempt`, one of whose jobs failed on an interrupted instance.

    `asked_for_previous`: this stack re-ran attempt - 1 (so `attempt` is its own re-run);
    `asked_for_this`: it already asked for `attempt` (a retried step, or a second interrupted job)."""
    refusals = (
        (not enabled, Verdict.OFF, "fleet.rerun_interrupted_jobs is off"),
        (
            run.conclusion == "cancelled",
            Verdict.CANCELLED,
            "the run was cancelled: someone stopped it on purpose",
        ),
        (
            run.status != "completed",
            Verdict.NOT_FAILED,
            f"the run is {run.status}: only a completed one is re-run",
        ),
        (
            run.conclusion != "failure",
            Verdict.NOT_FAILED,
            f"the run concluded {run.conclusion}: nothing to re-run",
        ),
        (
            run.latest_attempt != attempt,
            Verdict.NOT_LATEST,
            f"attempt {attempt} is not the latest ({run.latest_attempt}): it was re-run",
        ),
        (
            asked_for_previous,
            Verdict.OUR_RERUN,
            f"attempt {attempt} is this stack's re-run: re-run once only",
        ),
        (asked_for_this, Verdict.ASKED, f"a re-run of attempt {attempt} was asked for already"),
    )
    refused = next(((verdict, why) for applies, verdict, why in refusals if applies), None)
    return refused or (Verdict.RERUN, f"a job of attempt {attempt} failed on an interrupted spot instance")


def on_demand_for(attempt: int, asked_for_previous: bool) -> bool:
    """Whether an attempt's demand is served on-demand: it is this stack's re-run of interrupted jobs."""
    return attempt > 1 and asked_for_previous
