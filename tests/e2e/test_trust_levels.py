"""A job's level of trust end to end on the emulator: the fake GitHub sends each run's `workflow_run` with
its trigger (event, actors, head repository) and each job's `deployment`, and what demand decides reaches
the provision it starts; a job with an environment leaves no instance to the pool.

Each scenario ends with the accounting check: every instance of the stack has a live record, and every
live record an instance.
"""

from __future__ import annotations

import json

import pytest

from emulator.fake_github import Conclusion, FakeWorkflowRun, JobSpec
from emulator.fake_github.state import RunTrigger
from emulator.world import World
from runner_pool.domain.executions import instance_of_runner
from runner_pool.domain.trust import TrustLevel
from tests.e2e.conftest import LABEL, REPOSITORY, accounted, awaited, completed, job_of, settled

pytestmark = pytest.mark.slow


def run(system: World, trigger: RunTrigger, *jobs: JobSpec) -> FakeWorkflowRun:
    return completed(system, system.github.actions.start_run(REPOSITORY, "ci", jobs, trigger))


def levels(system: World, run: FakeWorkflowRun) -> list[str | None]:
    """The level each provision of the run's jobs carried, as its execution's input has it."""
    stepfunctions = system.stack.stepfunctions
    found: list[str | None] = []
    for execution in system.stack.executions():
        if execution["machine"] != "provision":
            continue
        request = json.loads(
            stepfunctions.describe_execution(executionArn=execution["executionArn"])["input"]
        )
        if str(run.run_id) in request["run_key"]:
            found.append(request["trust"])
    return found


@pytest.mark.parametrize(
    ("trigger", "level"),
    [
        (RunTrigger("push"), TrustLevel.TRUSTED),
        (RunTrigger("pull_request"), TrustLevel.UNTRUSTED),
        (RunTrigger("push", "dependabot[bot]"), TrustLevel.UNTRUSTED),
        (RunTrigger("pull_request", head_repository="someone/fork"), TrustLevel.UNTRUSTED),
    ],
    ids=["push", "pull-request", "dependabot", "fork"],
)
def test_a_runs_jobs_are_provisioned_at_the_level_its_trigger_decides(
    system: World, trigger: RunTrigger, level: TrustLevel
) -> None:
    # Given a run caused as `trigger` says
    # When its job is served
    served = run(system, trigger, JobSpec("build", LABEL, seconds=0.3))
    # Then every provision for it carried its level, whichever of its deliveries came first (a late
    # `requested` delivery: GitHub's answer about the run decides it)
    assert job_of(system, served).conclusion is Conclusion.SUCCESS
    assert set(levels(system, served)) == {level}
    settled(system)
    accounted(system)


def test_a_run_whose_requested_delivery_is_lost_and_whose_read_fails_is_served_undecided(
    system: World,
) -> None:
    # Given a run whose `requested` delivery never arrives, and which GitHub cannot read
    system.github.webhooks.drop_next("workflow_run", "requested")
    # When its job is served
    served = run(system, RunTrigger(read_fails=True), JobSpec("build", LABEL, seconds=0.3))
    # Then it ran, provisioned undecided (None: single use, fail closed)
    assert job_of(system, served).conclusion is Conclusion.SUCCESS
    assert set(levels(system, served)) == {None}
    # (under the whole suite a provision of this run was once dumped after an unhandled error, its job
    # served all the same; refresh's cleanup of what it held then took longer than the default minute)
    settled(system, timeout=120)
    accounted(system)


def test_a_job_with_an_environment_is_privileged_and_leaves_no_instance_to_the_pool(system: World) -> None:
    # Given a push's run whose job refers to an environment
    # When it is served
    served = run(system, RunTrigger("push"), JobSpec("deploy", LABEL, seconds=0.3, environment="production"))
    # Then it ran to its end on an instance handed over single use (a privileged provision is: were it
    # not, the release's detector would quarantine the instance, and stop the job, as it started), its
    # provision was privileged, and its instance is not pooled after the job: expired for refresh to
    # terminate
    assert job_of(system, served).conclusion is Conclusion.SUCCESS
    assert set(levels(system, served)) == {TrustLevel.PRIVILEGED}
    instance_id = instance_of_runner(job_of(system, served).runner_name)
    assert instance_id is not None
    awaited(
        system,
        lambda: all(r.instance_id != instance_id for r in system.records.live()),
        f"{instance_id} to leave the pool for good",
    )
    settled(system)
    accounted(system)
