"""Re-running a run's failed jobs once when an interruption failed one (domain/reruns.py), over the demand
ledger and GitHub.

Two callers meet here: the release of a job that failed on an instance EC2 was interrupting
(`interrupted`), and the run's `workflow_run completed` (`completed`). Each writes its own fact to the run
attempt's ledger item first and reads the other's after, so whichever comes second acts, and both may:
the marker lets one of them ask GitHub, and GitHub's own attempt count refuses the other. GitHub is read
only for a run attempt the ledger says had an interrupted job.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import Protocol

from runner_pool.domain.clock import Clock
from runner_pool.domain.labels import LabelError
from runner_pool.domain.reruns import (
    RERUN_LEASE_SECONDS,
    Claim,
    RerunLedger,
    RunNow,
    Verdict,
    decide,
    label_set,
)
from runner_pool.domain.run_keys import RunKey
from runner_pool.domain.runners import GitHubError, refused_for_good
from runner_pool.observability import count, logger


class RunReruns(Protocol):
    """GitHub's side of a re-run (adapters/github_app.py, with a token narrowed to `actions: write`)."""

    def run_now(self, repository: str, run_id: int) -> RunNow: ...

    def rerun_failed_jobs(self, repository: str, run_id: int) -> None: ...


@dataclass(frozen=True)
class Reruns:
    """`github` is built on first use: most run completions had no interrupted job, and ask GitHub nothing."""

    ledger: RerunLedger
    github: Callable[[], RunReruns]
    clock: Clock
    _: KW_ONLY
    enabled: bool
    holder: Callable[[], str] = lambda: uuid.uuid4().hex

    def interrupted(self, repository: str, run_key: str) -> Verdict | None:
        """A job of `run_key` failed on an instance EC2 was interrupting: noted on its run attempt, and
        decided now if the attempt completed first. None when nothing was decided."""
        if not self.enabled:
            return None
        try:
            run_id, attempt = RunKey.parse(run_key).run_attempt
        except (LabelError, ValueError):
            return None  # the instant tier's label names no run: its jobs are no run's to re-run
        if not run_id.isdigit() or not self.ledger.note_interrupted(int(run_id), attempt, label_set(run_key)):
            return None
        return self.completed(repository, int(run_id), attempt)

    def completed(self, repository: str, run_id: int, attempt: int) -> Verdict | None:
        """The run attempt completed: re-run its failed jobs if one of them failed on an interrupted
        instance and `decide` says so. None when no job of it was interrupted. GitHub's refusals for good
        are logged and counted (nothing is re-run: fail closed); an outage or a rate limit is raised, for
        the caller's retry."""
        if not self.enabled:
            return None
        record = self.ledger.rerun_record(run_id, attempt)
        if not record.interrupted:
            return None
        try:
            return self._decide(repository, run_id, attempt, record.interrupted, record.ours, record.asked)
        except GitHubError as exc:
            if not refused_for_good(exc):
                raise
            logger.error(
                "interrupted jobs not re-run: GitHub refused",
                repository=repository,
                run_id=run_id,
                attempt=attempt,
                status=exc.status,
                error=str(exc),
            )
            count("InterruptedRerunsRefused")
            return None

    def _decide(  # noqa: PLR0917 - the run attempt and what the ledger holds of it
        self,
        repository: str,
        run_id: int,
        attempt: int,
        interrupted: frozenset[str],
        ours: bool,
        asked: bool,
    ) -> Verdict:
        github = self.github()
        run = github.run_now(repository, run_id)
        verdict, why = decide(
            enabled=self.enabled, attempt=attempt, run=run, asked_for_previous=ours, asked_for_this=asked
        )
        if verdict is Verdict.RERUN:
            holder = self.holder()
            claim = self.ledger.claim_rerun(
                run_id, attempt, interrupted, holder, self.clock.now() + RERUN_LEASE_SECONDS
            )
            if claim is Claim.CLAIMED:
                github.rerun_failed_jobs(repository, run_id)
                self.ledger.rerun_asked(run_id, attempt, holder)
                count("InterruptedRunsRerun")
            else:
                verdict, why = (
                    Verdict.ASKED,
                    f"a re-run of attempt {attempt} is {claim.value} by another caller",
                )
        logger.info(
            "interrupted run attempt decided",
            repository=repository,
            run_id=run_id,
            attempt=attempt,
            label_sets=sorted(interrupted),
            verdict=verdict.value,
            why=why,
        )
        return verdict
