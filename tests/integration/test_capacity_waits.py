"""Jobs waiting for capacity: a provision EC2 leaves short notes their wait instead of asking again at once,
refresh asks again only after the back-off, and the provision that serves them ends the wait (moto, the
real provision machine, the fake GitHub)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from emulator.fake_github import JobSpec
from emulator.harness.github_app import OWNER, REPO
from emulator.harness.provision_world import ProvisionWorld, output, provision_world
from runner_pool.domain.refresh import RECONCILE_GRACE_SECONDS
from runner_pool.environment import STACK_TAG_KEY
from runner_pool.steps.refresh import Refresh
from tests.integration.test_refresh_reconcile import REFRESH_HANDLER, StartedExecutions

REPOSITORY = f"{OWNER}/{REPO}"
RUN = "pool=4242"


@pytest.fixture
def world() -> Iterator[ProvisionWorld]:
    with provision_world() as built:
        yield built
        accounting = built.accounting()
        assert accounting.holds, accounting.problems


def test_a_class_out_of_capacity_waits_with_ec2s_reason_and_is_served_when_it_is_back(
    world: ProvisionWorld,
) -> None:
    # Given EC2 has no capacity of the large class's size, spot or on-demand
    world.ec2.exhaust(2)
    # When a run asks for two runners
    result = output(world.provision(RUN, 2))
    # Then nothing was launched, and the jobs' wait is noted with EC2's reason instead of asking again at once
    assert result["cold"] == []
    (wait,) = world.plane.capacity_waits.all()
    assert (wait.run_key, wait.resource_class, wait.usage, wait.jobs, wait.tries) == (
        RUN,
        "large",
        "spot",
        2,
        1,
    )
    assert wait.reason.startswith("InsufficientInstanceCapacity (")
    assert wait.next_try == pytest.approx(world.clock.now() + 60, abs=5)
    assert world.ec2.calls["CreateFleet"] == 2  # spot, then the on-demand fallback; no redrive
    # When capacity is back and the jobs are provisioned again
    world.ec2.replenish(2)
    served = output(world.provision(RUN, 2, name="again"))
    # Then they are served, and the wait is over
    assert len(served["cold"]) == 2
    assert world.plane.capacity_waits.all() == []


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
        repository=REPOSITORY,
        run_key=run_key,
        resource_class="large",
        usage="spot",
        reason="InsufficientInstanceCapacity (2 pools)",
        jobs=2,
        execution="provision-first",
    )
    local.clock.advance(RECONCILE_GRACE_SECONDS)
    started = StartedExecutions()
    refresh = Refresh(
        plane.state_table,
        plane.fleet,
        plane.pool_queues,
        lambda: plane.github,
        clock=plane.clock,
        config=plane.config,
        stack_tag=(STACK_TAG_KEY, "runner-pool-local"),
        recent_demand=plane.recent_demand,
        executions=lambda: started,  # type: ignore[arg-type,return-value]
        capacity_waits=lambda: plane.capacity_waits,
    )
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
