"""Jobs waiting for capacity: a provision EC2 leaves short notes their wait instead of asking again at once,
refresh asks again only after the back-off, and the provision that serves them ends the wait (moto, the
real provision machine, the fake GitHub)."""

from __future__ import annotations

import pytest

from emulator.fake_github import JobSpec
from emulator.fake_github.payloads import HEAD_SHA
from emulator.harness.github_app import OWNER, REPO
from emulator.harness.provision_world import ProvisionWorld, output
from runner_pool.domain.capacity_waits import Shortfall
from runner_pool.domain.refresh import RECONCILE_GRACE_SECONDS
from runner_pool.steps.capacity_waits import CapacityWaitSteps
from runner_pool.steps.refresh import Refresh
from runner_pool.wiring import ControlPlane
from tests.integration.test_refresh_reconcile import REFRESH_HANDLER, StartedExecutions, recording_refresh

REPOSITORY = f"{OWNER}/{REPO}"
RUN = "pool=4242"


def refresh_with_waits(plane: ControlPlane, started: StartedExecutions) -> Refresh:
    """Refresh over the plane with its jobs' waits for capacity, its started executions recorded in `started`."""
    waits = CapacityWaitSteps(
        lambda: plane.capacity_waits, clock=plane.clock, check_runs=lambda: plane.github
    )
    return recording_refresh(plane, started, capacity_waits=waits)


def test_a_class_out_of_capacity_waits_with_ec2s_reason_and_is_served_when_it_is_back(
    world: ProvisionWorld,
) -> None:
    # Given a run with two queued jobs, and EC2 without capacity of the large class's size, spot or on-demand
    run = world.github.actions.start_run(
        REPOSITORY, "ci", [JobSpec("test", "pool=${{ github.run_id }}", matrix=2)]
    )
    run_key = f"pool={run.run_id}"
    world.ec2.exhaust(2)
    # When a provision asks for their two runners
    result = output(world.provision(run_key, 2))
    # Then nothing was launched, and the jobs' wait is noted with EC2's reason instead of asking again at once
    assert result["cold"] == []
    (wait,) = world.plane.capacity_waits.all()
    assert (wait.run_key, wait.resource_class, wait.usage, wait.jobs, wait.tries) == (
        run_key,
        "large",
        "spot",
        2,
        1,
    )
    assert wait.reason.startswith("InsufficientInstanceCapacity (")
    assert wait.next_try == pytest.approx(world.clock.now() + 60, abs=5)
    assert world.ec2.calls["CreateFleet"] == 2  # spot, then the on-demand fallback; no redrive
    # And the run is not held busy for the provision's whole busy time: the back-off decides the next try
    (recent,) = world.plane.recent_demand.runs()
    assert recent.busy_until <= world.clock.now()
    # And the jobs' author finds a check run on the run's commit naming the jobs, the class and EC2's error
    (check_run,) = world.github.state.check_runs.values()
    assert wait.check_run is not None
    assert wait.check_run.check_run_id == check_run["id"]
    assert (check_run["head_sha"], check_run["status"]) == (HEAD_SHA, "in_progress")
    assert check_run["output"]["title"].startswith("`test")
    assert check_run["output"]["title"].endswith("wait for a `large` runner: EC2 has no capacity")
    assert "`large`" in check_run["output"]["summary"]
    assert "InsufficientInstanceCapacity" in check_run["output"]["summary"]
    # When another provision ends short / Then the wait is tried once more, and no second check run is made
    output(world.provision(run_key, 2, name="second"))
    (again,) = world.plane.capacity_waits.all()
    assert again.tries == 2
    assert len(world.github.state.check_runs) == 1
    # When capacity is back and the jobs are provisioned again
    world.ec2.replenish(2)
    served = output(world.provision(run_key, 2, name="third"))
    # Then they are served, the wait is over, and the check run concluded
    assert len(served["cold"]) == 2
    assert world.plane.capacity_waits.all() == []
    assert (check_run["status"], check_run["conclusion"]) == ("completed", "success")


def test_a_provision_ended_short_frees_its_run_for_reconciliation_unless_a_later_one_began(
    world: ProvisionWorld,
) -> None:
    recent, clock = world.plane.recent_demand, world.local.clock
    # Given a run's provision begun, and a later one for the same run begun 5 s after
    first = clock.now()
    recent.note(REPOSITORY, 7, 1, "pool=7", busy_for=300, at=first)
    clock.advance(5)
    recent.note(REPOSITORY, 7, 1, "pool=7/class=small", busy_for=300, at=clock.now())
    # When the first ends short / Then the run stays busy: the later one may still be at work
    recent.provision_ended(REPOSITORY, 7, 1, first)
    (run,) = recent.runs()
    assert run.busy_until > clock.now()
    # When the later one ends short (and its Finish is retried) / Then the run is free to be reconciled
    recent.provision_ended(REPOSITORY, 7, 1, run.demand_at)
    recent.provision_ended(REPOSITORY, 7, 1, run.demand_at)
    (run,) = recent.runs()
    assert run.busy_until <= clock.now()


def test_refresh_asks_again_for_waiting_jobs_only_after_the_back_off(world: ProvisionWorld) -> None:
    local = world.local
    plane = local.plane
    # Given a run whose two queued jobs wait for capacity after one short provision
    run = local.github.actions.start_run(
        REPOSITORY, "ci", [JobSpec("test", "pool=${{ github.run_id }}", matrix=2)]
    )
    run_key = f"pool={run.run_id}"
    plane.recent_demand.note(REPOSITORY, run.run_id, 1, run_key, busy_for=0)
    wait = plane.capacity_waits.note(
        Shortfall(
            execution="provision-first",
            repository=REPOSITORY,
            run_key=run_key,
            resource_class="large",
            usage="spot",
            jobs=2,
            reason="InsufficientInstanceCapacity (2 pools)",
        )
    )
    local.clock.advance(RECONCILE_GRACE_SECONDS)
    started = StartedExecutions()
    refresh = refresh_with_waits(plane, started)
    check = local.policy_check
    # When refresh reconciles before the next try / Then the jobs are left to wait
    with check.acting_as(check.iam.function(REFRESH_HANDLER)):
        assert refresh.run(1).jobs_reprovisioned == 0
    # When the back-off has passed / Then they are provisioned again
    local.clock.advance(wait.next_try - local.clock.now())
    with check.acting_as(check.iam.function(REFRESH_HANDLER)):
        assert refresh.run(2).jobs_reprovisioned == 2
    (again,) = started.provisions.values()
    assert (again.run_key, again.count) == (run_key, 2)


def test_a_run_that_finishes_while_its_jobs_wait_ends_the_wait_and_concludes_its_check_run(
    world: ProvisionWorld,
) -> None:
    local = world.local
    plane = local.plane
    # Given a run whose job waits for capacity after a short provision, its author told by a check run
    run = local.github.actions.start_run(REPOSITORY, "ci", [JobSpec("test", "pool=${{ github.run_id }}")])
    run_key = f"pool={run.run_id}"
    plane.recent_demand.note(REPOSITORY, run.run_id, 1, run_key, busy_for=0)
    world.ec2.exhaust(2)
    output(world.provision(run_key, 1))
    (check_run,) = world.github.state.check_runs.values()
    assert check_run["status"] == "in_progress"
    # When the run is cancelled (its release marks it finished), and refresh reconciles
    plane.state_table.mark_run_finished(run_key)
    refresh = refresh_with_waits(plane, StartedExecutions())
    check = local.policy_check
    with check.acting_as(check.iam.function(REFRESH_HANDLER)):
        refresh.run(1)
    # Then the wait is over, and the check run says the run finished first, without claiming success
    assert plane.capacity_waits.all() == []
    assert (check_run["status"], check_run["conclusion"]) == ("completed", "neutral")
