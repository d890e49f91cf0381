"""Re-running a run's failed jobs once, when one failed because EC2 interrupted the spot instance it ran on.

GitHub re-runs "all of the failed jobs and their dependent jobs in a workflow run" as a new attempt of the
same run (`POST /repos/{owner}/{repo}/actions/runs/{run_id}/rerun-failed-jobs`, docs.github.com, "REST API
endpoints for workflow runs", "Re-run failed jobs from a workflow run"); an App needs the "Actions"
repository permission at `write` for it. A run can be re-run at most 50 times, and only a completed one
(docs.github.com, "Re-running workflows and jobs").

Two facts meet in the demand ledger's item of the run attempt, whichever comes first: the release of a job
that failed on an instance EC2 was interrupting notes the job's label set (`RerunLedger.note_interrupted`),
and the run's completion marks the attempt completed. Whoever writes second finds the other's fact and asks
`decide`, the rule, over what GitHub says of the run now and what this stack asked before:

- only a run that completed as failed: a cancelled run was stopped by someone, on purpose;
- only its latest attempt: a later one means someone (a person, or this stack) re-ran it already;
- once per attempt, and never the attempt this stack's own re-run made: its interruption is not re-run
  again, so a class that keeps being interrupted costs one re-run per run, not a loop;
- not at all when `fleet.rerun_interrupted_jobs` is off.

Once per attempt is a marker claimed with one conditional write on the item of the attempt the re-run makes
(attempt + 1), in the same write that names the label sets that attempt serves on-demand whatever their
`usage=` says (`served_on_demand`): a job interrupted once is not put back on the market that took it.
The marker is written before GitHub is asked, so the re-run's `queued` jobs find it however fast they come.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Protocol

from runner_pool.domain.clock import Epoch
from runner_pool.domain.run_keys import RunKey

RERUN_LEASE_SECONDS = 120.0
"""How long a claim of the marker holds before another caller may take it: past a read of the run and the
re-run request, each with the GitHub client's retries. A claim whose holder died before asking lapses, so a
redelivered completion asks instead; one whose holder asked is marked asked for good."""


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


def label_set(run_key: str) -> str:
    """The run key with its attempt left out: the labels a job asked for, the same in every attempt of its
    run (domain.run_keys), by which attempt + 1's demand is known to be the interrupted jobs' again."""
    return str(replace(RunKey.parse(run_key), attempt=1))


def served_on_demand(run_key: str, on_demand: Collection[str]) -> bool:
    """Whether a run key's demand is served on-demand: its attempt is this stack's re-run of jobs of its
    label set that an interruption failed (`on_demand`: the label sets the attempt's ledger item names)."""
    return label_set(run_key) in on_demand


def job_failed(conclusion: str | None) -> bool:
    """A `workflow_job` conclusion that a re-run of failed jobs runs again. A runner EC2 took away fails its
    job ("The self-hosted runner: ... lost communication with the server"), concluded `failure`; GitHub's
    "Re-run failed jobs" re-runs the failed ones (docs.github.com, "Re-running workflows and jobs")."""
    return conclusion == "failure"


class Claim(StrEnum):
    """What claiming the once-per-attempt marker found."""

    CLAIMED = "claimed"
    """Ours until the lease ends: ask GitHub, then mark it asked."""
    ASKED = "asked"
    """Someone asked GitHub already."""
    HELD = "held"
    """Another caller holds it now and is asking."""


@dataclass(frozen=True)
class RerunRecord:
    """What the demand ledger holds about one run attempt's interrupted jobs."""

    interrupted: frozenset[str] = frozenset()
    """Label sets whose jobs failed on an interrupted instance in the attempt."""
    ours: bool = False
    """The attempt is this stack's re-run of the one before (the marker on its item)."""
    asked: bool = False
    """This stack asked GitHub to re-run the attempt (the marker on the next attempt's item)."""


class RerunLedger(Protocol):
    """The demand ledger's run-attempt items as re-runs use them (adapters/demand_ledger.py)."""

    def note_interrupted(self, run_id: int, attempt: int, label_set: str) -> bool:
        """Note that a job of `label_set` failed on an interrupted instance in the attempt; whether the
        attempt has completed already (then the caller asks for the re-run: the completion came first)."""
        ...

    def rerun_record(self, run_id: int, attempt: int) -> RerunRecord:
        """The attempt's interrupted label sets, and this stack's markers about it (consistent reads)."""
        ...

    def claim_rerun(
        self, run_id: int, attempt: int, on_demand: Collection[str], holder: str, until: Epoch
    ) -> Claim:
        """Claim the marker of re-running `attempt` on the item of attempt + 1, naming the label sets that
        attempt serves on-demand, unless asked already or held by another caller whose lease stands."""
        ...

    def rerun_asked(self, run_id: int, attempt: int, holder: str) -> None:
        """Mark the claim `holder` holds as asked: nobody re-runs the attempt again."""
        ...
