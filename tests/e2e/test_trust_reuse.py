"""Who may follow whom on an instance, by level of trust, end to end on the emulator: the fake GitHub sends
each run's `workflow_run` with its real trigger (event, actor, head repository) and each job's
`deployment`, and the pool keeps a pristine floor, so single-use jobs start warm.

Each scenario ends with the accounting check: every instance of the stack has a live record, and every
live record an instance.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulator.fake_github import Conclusion, FakeWorkflowRun, JobSpec
from emulator.fake_github.state import RunTrigger
from emulator.timeline import Happening
from emulator.world import World
from runner_pool.domain.executions import instance_of_runner
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.trust import TrustLevel
from tests.e2e.conftest import LABEL, REPOSITORY, accounted, awaited, completed, e2e_world, job_of, settled

pytestmark = pytest.mark.slow

PUSH = RunTrigger("push")
PULL_REQUEST = RunTrigger("pull_request")
DEPENDABOT = RunTrigger("push", "dependabot[bot]")


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[World]:
    """The whole system with class large keeping one pristine instance idle (a floor, not an addition)."""
    with e2e_world(tmp_path, warm_pool_minimum={"large": {"hot": 0, "pristine": 1}}) as running:
        yield running


def serve(system: World, trigger: RunTrigger, job: JobSpec | None = None) -> str:
    """Run one job caused as `trigger` says; the instance it ran on."""
    spec = job or JobSpec("build", LABEL, seconds=0.3)
    run = completed(system, system.github.actions.start_run(REPOSITORY, "ci", [spec], trigger))
    assert job_of(system, run).conclusion is Conclusion.SUCCESS
    return instance_of(system, run)


def instance_of(system: World, run: FakeWorkflowRun) -> str:
    instance_id = instance_of_runner(job_of(system, run).runner_name)
    assert instance_id is not None
    return instance_id


def pristine_idle(system: World) -> set[str]:
    return {
        r.instance_id
        for r in system.records.live()
        if r.state is InstanceState.IDLE and r.jobs_served == 0 and not r.threshold_passed(time.time())
    }


def a_pristine_one(system: World) -> str:
    """Wait for refresh to keep its floor; the pristine instance waiting idle."""
    pristine: set[str] = awaited(
        system, lambda: pristine_idle(system), "a pristine instance idle in the pool"
    )
    return sorted(pristine)[0]


def terminated(system: World, instance_id: str) -> None:
    awaited(
        system,
        lambda: system.timeline.first(Happening.TERMINATED, instance_id=instance_id),
        f"{instance_id} to be terminated",
    )


def level_of(system: World, instance_id: str) -> TrustLevel | None:
    (record,) = [r for r in system.records.live() if r.instance_id == instance_id]
    return record.trust


def test_a_pull_requests_job_and_a_pushs_job_never_share_an_instance(pool: World) -> None:
    # Given a push's job served, its instance back in the pool as a trusted one
    pushed = serve(pool, PUSH)
    settled(pool)
    assert level_of(pool, pushed) is TrustLevel.TRUSTED

    # When a pull request's job of the same repository comes, then another push's, then another pull request's
    requested = serve(pool, PULL_REQUEST)
    settled(pool)
    pushed_again = serve(pool, PUSH)
    settled(pool)
    requested_again = serve(pool, PULL_REQUEST)

    # Then the pull request never took the push's instance, and each level reused its own
    assert requested != pushed
    assert pushed_again == pushed
    assert requested_again == requested
    settled(pool)
    accounted(pool)


def test_a_job_with_an_environment_takes_a_warm_pristine_instance_and_it_is_terminated_after(
    pool: World,
) -> None:
    # Given a push's job served (a used, trusted instance idle) and a pristine instance in the pool
    pushed = serve(pool, PUSH)
    settled(pool)
    pristine = a_pristine_one(pool)
    assert pristine != pushed

    # When a push's job that refers to an environment comes
    deployed = serve(pool, PUSH, JobSpec("deploy", LABEL, seconds=0.3, environment="production"))

    # Then it ran on the pristine instance, launched before it was queued (warm), not on the used one
    assert deployed == pristine
    # And that instance is terminated after its job, never pooled, while the used one waits in the pool
    terminated(pool, deployed)
    settled(pool)
    accounted(pool)
    assert pushed in {r.instance_id for r in pool.records.live()}
    assert deployed not in {r.instance_id for r in pool.records.live()}


def test_a_dependabot_job_never_precedes_a_trusted_one(pool: World) -> None:
    # Given Dependabot's job served (a push by dependabot[bot]: untrusted), its instance back in the pool
    updated = serve(pool, DEPENDABOT)
    settled(pool)
    assert level_of(pool, updated) is TrustLevel.UNTRUSTED

    # When a push by a person comes
    pushed = serve(pool, PUSH)

    # Then it did not take Dependabot's instance
    assert pushed != updated
    settled(pool)
    accounted(pool)


def test_a_run_whose_level_cannot_be_known_is_served_single_use(pool: World) -> None:
    # Given a push's job served, its instance in the pool
    pushed = serve(pool, PUSH)
    settled(pool)

    # When a run comes whose `requested` delivery is lost and which GitHub cannot read
    pool.github.webhooks.drop_next("workflow_run", "requested")
    undecided = serve(pool, RunTrigger("push", read_fails=True))

    # Then it took no used instance, and its own is terminated after its job: fail closed
    assert undecided != pushed
    terminated(pool, undecided)
    settled(pool)
    accounted(pool)
    assert undecided not in {r.instance_id for r in pool.records.live()}
