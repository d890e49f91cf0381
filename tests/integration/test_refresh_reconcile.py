"""Refresh's two jobs of issue 13: a runner that died before its job is replaced (fix 8), and queued jobs
that no runner of ours is free to take are provisioned again (no job is ever stranded). GitHub is the
fake, answering List jobs for a workflow run attempt; executions are recorded, not run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from emulator.fake_github import FakeWorkflowRun, JobSpec
from emulator.harness.control_plane import STACK_NAME, LocalControlPlane
from emulator.harness.github_app import OWNER, REPO
from runner_pool.domain.executions import ProvisionRequest, ReleaseRequest
from runner_pool.domain.records import Signal
from runner_pool.domain.refresh import RECONCILE_GRACE_SECONDS, RefreshReport
from runner_pool.domain.trust import TrustLevel
from runner_pool.environment import STACK_TAG_KEY
from runner_pool.steps.refresh import Refresh
from runner_pool.wiring import ControlPlane

REPOSITORY = f"{OWNER}/{REPO}"


@dataclass
class StartedExecutions:
    """The executions refresh asked for, by name, as Step Functions Standard keeps them (once each)."""

    provisions: dict[str, ProvisionRequest] = field(default_factory=dict)
    releases: dict[str, ReleaseRequest] = field(default_factory=dict)

    def provision(self, request: ProvisionRequest) -> bool:
        return self.provisions.setdefault(request.execution_name, request) is request

    def release(self, request: ReleaseRequest) -> bool:
        return self.releases.setdefault(request.execution_name, request) is request


REFRESH_HANDLER = "runner_pool.handlers.refresh.refresh"


def refresh(local: LocalControlPlane, started: StartedExecutions, tick: int = 1) -> RefreshReport:
    """One refresh run, its AWS calls checked against refresh's role (the local stack fails the test
    at its end on a call the synthesized policy denies)."""
    check = local.policy_check
    with check.acting_as(check.iam.function(REFRESH_HANDLER)):
        return _refresh(local, started, tick)


def _refresh(local: LocalControlPlane, started: StartedExecutions, tick: int) -> RefreshReport:
    return recording_refresh(local.plane, started).run(tick)


def recording_refresh(plane: ControlPlane, started: StartedExecutions, **collaborators: Any) -> Refresh:
    """Refresh over the plane, its started executions recorded in `started` instead of run; with
    `collaborators` (Refresh's optional ones) besides."""
    return Refresh(
        plane.state_table,
        plane.fleet,
        plane.pool_queues,
        lambda: plane.github,
        clock=plane.clock,
        config=plane.config,
        stack_tag=(STACK_TAG_KEY, STACK_NAME),
        recent_demand=plane.recent_demand,
        executions=lambda: started,  # type: ignore[arg-type,return-value]
        **collaborators,
    )


def queued_run(local: LocalControlPlane, jobs: int) -> tuple[FakeWorkflowRun, str]:
    run = local.github.actions.start_run(
        REPOSITORY, "ci", [JobSpec("test", "pool=${{ github.run_id }}", matrix=jobs)]
    )
    return run, f"pool={run.run_id}"


def test_a_runner_that_died_before_its_job_is_released_and_replaced(local: LocalControlPlane) -> None:
    # Given a running instance of a run with recent demand, whose agent reports its runner exited jobless
    run, run_key = queued_run(local, 1)
    local.plane.recent_demand.note(REPOSITORY, run.run_id, 1, run_key, busy_for=0)
    (record,) = local.running(run_key)
    local.table.write_signal(
        record.instance_id, Signal.UD_REG_FAILED, run_key, "the runner exited before it took a job"
    )
    started = StartedExecutions()
    # When refresh runs (twice: the next run finds the same, as its release has not settled yet)
    report = refresh(local, started)
    refresh(local, started, tick=2)
    # Then the instance's release was asked for once, naming its runner, and one more runner for the run
    assert report.runners_replaced == 1
    (release,) = started.releases.values()
    assert (release.instance_id, release.run_key) == (record.instance_id, run_key)
    assert release.runner_id == local.record(record.instance_id).runner_id
    (provision,) = started.provisions.values()
    assert (provision.repository, provision.run_key, provision.count) == (REPOSITORY, run_key, 1)


def test_queued_jobs_without_a_free_runner_are_provisioned_again(local: LocalControlPlane) -> None:
    # Given a run with three jobs queued for a while, a provision that ended short, and one runner of
    # ours still free for the run (registered, not yet given a job)
    run, run_key = queued_run(local, 3)
    local.plane.recent_demand.note(REPOSITORY, run.run_id, 1, run_key, busy_for=0)
    local.running(run_key)
    local.clock.advance(RECONCILE_GRACE_SECONDS)
    started = StartedExecutions()
    # When refresh reconciles
    report = refresh(local, started)
    # Then GitHub was asked about the run, and the two jobs beyond the free runner were provisioned
    assert report.runs_reconciled == 1
    assert report.jobs_reprovisioned == 2
    (provision,) = started.provisions.values()
    assert provision.count == 2
    assert set(provision.job_ids) <= set(run.job_ids)
    # And the next refresh leaves the run alone while that provision may still be at work
    again = refresh(local, started, tick=2)
    assert again.runs_reconciled == 0


MARKS = [
    pytest.param({"repository_id": 186853077}, "repository_id", 186853077, id="repository-id"),
    pytest.param({"single_use": True}, "public", True, id="single-use-public-or-fork"),
    pytest.param({"single_use": False}, "public", False, id="private"),
    pytest.param({"on_demand": True}, "on_demand", True, id="on-demand-re-run-of-an-interruption"),
    pytest.param({"on_demand": False}, "on_demand", False, id="usage-as-its-label-says"),
]
"""What a run's provision noted, and the field of the provision refresh starts again that keeps it: the
repository's id (its runner joins that repository's group), single use (a public repository's or a
fork's), and on-demand (the re-run of a job an interruption failed, whatever its label's usage)."""


@pytest.mark.parametrize(("noted", "field", "kept"), MARKS)
def test_jobs_provisioned_again_keep_what_their_runs_provision_noted(
    local: LocalControlPlane, noted: dict[str, object], field: str, kept: object
) -> None:
    # Given a run whose provision noted this of its run key, its one job queued for a while with no
    # runner of ours for it
    run, run_key = queued_run(local, 1)
    local.plane.recent_demand.note(REPOSITORY, run.run_id, 1, run_key, busy_for=0, **noted)  # type: ignore[arg-type]
    local.clock.advance(RECONCILE_GRACE_SECONDS)
    started = StartedExecutions()
    # When refresh provisions the job again
    refresh(local, started)
    # Then the provision keeps it
    (provision,) = started.provisions.values()
    assert getattr(provision, field) == kept


@pytest.mark.parametrize(
    ("noted", "level"),
    [
        ((TrustLevel.TRUSTED, TrustLevel.UNTRUSTED), TrustLevel.TRUSTED),
        ((None, TrustLevel.UNTRUSTED), TrustLevel.UNTRUSTED),
        ((None,), None),
        ((TrustLevel.TRUSTED, TrustLevel.PRIVILEGED, TrustLevel.TRUSTED), TrustLevel.PRIVILEGED),
    ],
    ids=["first-level-stands", "unknown-then-known", "never-known", "privileged-label-stays"],
)
def test_jobs_provisioned_again_carry_their_runs_level(
    local: LocalControlPlane, noted: tuple[TrustLevel | None, ...], level: TrustLevel | None
) -> None:
    # Given a run whose provisions of one run key had these levels, in turn, its job queued for a while
    # with no runner of ours for it
    run, run_key = queued_run(local, 1)
    for trust in noted:
        local.plane.recent_demand.note(REPOSITORY, run.run_id, 1, run_key, busy_for=0, trust=trust)
    local.clock.advance(RECONCILE_GRACE_SECONDS)
    started = StartedExecutions()
    # When refresh reconciles / Then the provision carries the run's level as first decided, privileged
    # once its pool label was, and None (single use) while never known
    refresh(local, started)
    (provision,) = started.provisions.values()
    assert provision.trust is level


def test_a_run_whose_provision_may_still_be_at_work_is_not_reconciled(local: LocalControlPlane) -> None:
    # Given a run whose provision began a moment ago and has claimed nothing yet
    run, run_key = queued_run(local, 2)
    local.plane.recent_demand.note(REPOSITORY, run.run_id, 1, run_key, busy_for=300)
    local.clock.advance(RECONCILE_GRACE_SECONDS)
    started = StartedExecutions()
    # When refresh runs: Then it does not even ask GitHub, and starts nothing
    calls = local.github.state.calls.copy()
    assert refresh(local, started).runs_reconciled == 0
    assert not started.provisions
    assert not any("jobs" in route for route in local.github.state.calls - calls)


def test_a_run_with_no_recent_demand_is_forgotten(local: LocalControlPlane) -> None:
    # Given a run whose last demand is more than an hour old
    run, run_key = queued_run(local, 1)
    local.plane.recent_demand.note(REPOSITORY, run.run_id, 1, run_key, busy_for=0)
    local.clock.advance(3601)
    # When refresh runs: Then it is forgotten, not reconciled
    started = StartedExecutions()
    assert refresh(local, started).runs_reconciled == 0
    assert local.plane.recent_demand.runs() == []
