"""A run whose registration GitHub refused for good is not provisioned again by refresh every minute (issue
38, item 3): its provision notes the refusal on the run's recent demand, and reconciliation leaves the run
alone until the back-off has passed, so a policy the owner fixes is picked up. The provision runs on the
real ASL; the executions refresh asks for are recorded, not run."""

from __future__ import annotations

from emulator.fake_github import JobSpec
from emulator.harness.github_app import OWNER, REPO
from emulator.harness.provision_world import ProvisionWorld, output
from runner_pool.domain.provision import busy_seconds
from runner_pool.domain.refresh import RECONCILE_GRACE_SECONDS, REFUSAL_BACKOFF_SECONDS, RefreshReport
from tests.integration.test_refresh_reconcile import StartedExecutions, recording_refresh

REPOSITORY = f"{OWNER}/{REPO}"
JIT_ROUTE = "POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig"
JOBS_ROUTE = "GET /repos/{owner}/{repo}/actions/runs/{run_id}/attempts/{attempt_number}/jobs"


def refresh(world: ProvisionWorld, started: StartedExecutions, tick: int) -> RefreshReport:
    return recording_refresh(world.plane, started).run(tick)


def refused_run(world: ProvisionWorld) -> str:
    """A run of two queued jobs whose provision GitHub refused; its run key. Time then passes beyond the
    grace and the provision's busy time, so that reconciliation would take it up."""
    run = world.github.actions.start_run(
        REPOSITORY, "ci", [JobSpec("test", "pool=${{ github.run_id }}", matrix=2)]
    )
    run_key = f"pool={run.run_id}"
    assert output(world.provision(run_key, 2))["refused"] is not None
    world.clock.advance(RECONCILE_GRACE_SECONDS + busy_seconds(world.plane.config.timeouts))
    return run_key


def test_a_refused_run_reconciled_twice_makes_no_provision_and_no_registration(
    refusing_world: ProvisionWorld,
) -> None:
    world = refusing_world
    # Given a run whose provision GitHub refused for good, its jobs still queued
    refused_run(world)
    asked = world.github.state.calls[JIT_ROUTE]
    started = StartedExecutions()
    # When refresh runs twice, a minute apart
    first = refresh(world, started, tick=1)
    world.clock.advance(60)
    second = refresh(world, started, tick=2)
    # Then it started no provision and GitHub was asked for no registration, nor for the run's jobs
    assert started.provisions == {}
    assert world.github.state.calls[JIT_ROUTE] == asked
    assert world.github.state.calls[JOBS_ROUTE] == 0
    # And both runs counted the run as refused, not as reconciled
    assert (first.runs_refused, second.runs_refused) == (1, 1)
    assert (first.runs_reconciled, second.runs_reconciled) == (0, 0)
    # And the refusal is kept with GitHub's reason
    (run,) = world.plane.recent_demand.runs()
    assert run.refused_reason is not None
    assert "runner group" in run.refused_reason


def test_a_refused_run_is_asked_about_again_once_the_back_off_has_passed(
    refusing_world: ProvisionWorld,
) -> None:
    world = refusing_world
    # Given a run whose provision GitHub refused for good
    run_key = refused_run(world)
    started = StartedExecutions()
    # When the back-off has passed (the organisation's owner may have changed the policy) and refresh runs
    world.clock.advance(REFUSAL_BACKOFF_SECONDS)
    report = refresh(world, started, tick=1)
    # Then the run's queued jobs are provisioned again, once
    assert report.runs_refused == 0
    (provision,) = started.provisions.values()
    assert (provision.run_key, provision.count) == (run_key, 2)


def test_a_new_provision_of_the_run_clears_its_refusal(refusing_world: ProvisionWorld) -> None:
    world = refusing_world
    # Given a run whose provision GitHub refused
    run_key = refused_run(world)
    # When another provision of the run begins (new demand: it asks GitHub anew)
    world.plane.recent_demand.note(REPOSITORY, int(run_key.removeprefix("pool=")), 1, run_key, busy_for=0)
    # Then the run carries no refusal any more
    (run,) = world.plane.recent_demand.runs()
    assert (run.refused_at, run.refused_reason) == (None, None)
