"""GitHub as it really behaves, end to end: re-runs, jobs with several labels, and a run's completion
that arrives before its jobs. Each scenario ends with the accounting check.

GitHub's side is the fake's cited behaviour (emulator/fake_github/actions.py): a re-run keeps the run
id and our label and counts up `run_attempt`; a job goes only to a runner with all of its labels,
compared without case; whether JIT runners get the default labels is undocumented, so the
multi-label scenario gives them none (the harder case).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from emulator.deployment import Timers
from emulator.fake_github import Conclusion, FakeJob, FakeWorkflowRun, JobSpec
from emulator.timeline import Happening
from emulator.world import COMPRESSED_TIMEOUTS, World, compressed_config, world
from runner_pool.domain.executions import instance_of_runner
from tests.e2e.conftest import FAST_INSTANCES, FAST_TIMERS, LABEL, awaited, completed, demand_handled, settled
from tests.e2e.conftest import accounted as accounted_for

pytestmark = pytest.mark.slow

JOB_SECONDS = 5.0
"""Longer than the spread of one provision's runners registering: a job that ends before its
provision has set its instance running loses that instance (issue 13's defect 6, another part's
fix), and these scenarios are about which instances serve a re-run, not about that."""


def launched(system: World) -> list[str]:
    return [e.instance_id or "" for e in system.timeline.events() if e.happening is Happening.LAUNCHED]


def provisions(system: World) -> list[dict[str, object]]:
    return [e for e in system.stack.executions() if e["machine"] == "provision"]


def jobs_of_attempt(system: World, run: FakeWorkflowRun, attempt: int) -> list[FakeJob]:
    jobs = [system.github.state.jobs[job_id] for job_id in run.job_ids]
    return [job for job in jobs if job.run_attempt == attempt]


def accounted(system: World) -> None:
    settled(system)
    accounted_for(system)


def a_run_that_failed(system: World) -> tuple[FakeWorkflowRun, list[str]]:
    """A run of two jobs, `test` failing in attempt 1, completed and its instances back in the pool."""
    run = system.start_run(
        "ci",
        JobSpec("build", LABEL, seconds=JOB_SECONDS),
        JobSpec("test", LABEL, seconds=JOB_SECONDS, fail_attempts=(1,)),
    )
    completed(system, run)
    assert run.conclusion is Conclusion.FAILURE
    settled(system)
    return run, launched(system)


def test_rerun_failed_jobs_runs_attempt_2_on_a_warm_runner_of_ours(system: World) -> None:
    # Given a run whose `test` job failed, its instances idle in the pool
    run, before = a_run_that_failed(system)
    # When its failed jobs are re-run (same run id, same label, attempt 2)
    system.github.actions.rerun_failed_jobs(run.run_id)
    completed(system, run)
    # Then attempt 2's job succeeded on an instance taken warm from the pool; nothing new was launched
    (rerun,) = jobs_of_attempt(system, run, 2)
    assert (rerun.name, rerun.conclusion) == ("test", Conclusion.SUCCESS)
    assert instance_of_runner(rerun.runner_name) in before
    assert launched(system) == before
    assert run.conclusion is Conclusion.SUCCESS
    accounted(system)


def test_rerun_all_jobs_runs_every_job_of_attempt_2_on_warm_runners_of_ours(system: World) -> None:
    # Given a completed run of two jobs, its instances idle in the pool
    run, before = a_run_that_failed(system)
    # When all its jobs are re-run
    system.github.actions.rerun_all_jobs(run.run_id)
    completed(system, run)
    # Then both jobs of attempt 2 succeeded, each on one of the pooled instances
    rerun = jobs_of_attempt(system, run, 2)
    assert sorted((job.name, job.conclusion) for job in rerun) == [
        ("build", Conclusion.SUCCESS),
        ("test", Conclusion.SUCCESS),
    ]
    assert {instance_of_runner(job.runner_name) for job in rerun} <= set(before)
    assert launched(system) == before
    accounted(system)


def test_a_job_with_several_labels_runs_on_a_runner_carrying_every_one(system: World) -> None:
    # Given JIT runners get no default labels, and a job asking [self-hosted, linux, gpu, pool=…]
    system.github.state.jit_default_labels = False
    runs_on = ("self-hosted", "linux", "gpu", LABEL)
    # When its run is started
    run = completed(system, system.start_run("gpu", JobSpec("train", runs_on, seconds=0.5)))
    # Then the job ran to success on a runner of ours registered with each of its labels
    (job,) = jobs_of_attempt(system, run, 1)
    assert job.conclusion is Conclusion.SUCCESS
    assert instance_of_runner(job.runner_name) in launched(system)
    wanted = {label.lower() for label in job.labels}
    assert wanted <= {label.lower() for label in job.runner_labels}
    accounted(system)


# --- a completion before its jobs (fix 7) -------------------------------------------------------------


@pytest.fixture
def no_redelivery(tmp_path: Path) -> Iterator[World]:
    """The whole system with refresh too slow to redeliver anything: the test redelivers, in its order."""
    config = compressed_config(timeouts={**COMPRESSED_TIMEOUTS, "release_receipt_seconds": 8})
    timers = Timers(refresh_every_seconds=3600, batching_window_seconds=FAST_TIMERS.batching_window_seconds)
    with world(tmp_path, config=config, instance_settings=FAST_INSTANCES, timers=timers) as running:
        yield running


def test_a_run_completion_delivered_before_its_jobs_means_no_runner_is_provisioned(
    no_redelivery: World,
) -> None:
    system = no_redelivery
    hook = system.github.webhooks
    url, secret = hook.url, hook.secret
    assert url is not None
    # Given an outage of our webhook endpoint, during which a run was started and cancelled
    hook.disconnect()
    run = system.start_run("ci", JobSpec("build", LABEL, seconds=0.5))
    system.github.actions.cancel_run(run.run_id)
    assert hook.flush()
    failed = sorted(system.github.state.deliveries.values(), key=lambda d: d.delivery_id)
    assert not any(d.succeeded for d in failed)
    hook.point_at(url, secret)
    # When, after the outage, the run's completion is redelivered first and its job's queued event after
    run_completed = next(d for d in failed if (d.event, d.action) == ("workflow_run", "completed"))
    job_queued = next(d for d in failed if (d.event, d.action) == ("workflow_job", "queued"))
    hook.redeliver(run_completed.delivery_id)
    ledger = system.aws.client("dynamodb")
    table = system.stack.plane.settings.require("idempotency_table_name", "the demand ledger")

    def completion_noted() -> bool:
        item = ledger.get_item(
            TableName=table, Key={"id": {"S": f"run#{run.run_id}/attempt#1"}}, ConsistentRead=True
        ).get("Item")
        return item is not None and "completed_at" in item

    awaited(system, completion_noted, "the run's completion in the demand ledger")
    hook.redeliver(job_queued.delivery_id)

    def redeliveries() -> list[int]:
        return [d.status_code for d in system.github.state.deliveries.values() if d.redelivery]

    # (GitHub answers a redelivery request before it is attempted; the fake waits a second for the attempt,
    # which a loaded machine can outlast)
    awaited(system, lambda: len(redeliveries()) == 2, "the job's queued event redelivered")
    assert redeliveries() == [202, 202]
    demand_handled(system)
    # Then no runner was provisioned for the finished run, and nothing was launched
    assert provisions(system) == []
    assert launched(system) == []
    accounted(system)
