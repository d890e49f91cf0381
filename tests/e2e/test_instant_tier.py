"""A class's instant tier end to end on the emulator: pristine instances whose runners wait registered with
the class's generic label, each given a job by the fake GitHub with no step of ours in between, terminated
after it, and the tier refilled.

Each scenario ends with the accounting check: every instance of the stack has a live record, and every
live record an instance.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from demo.burst import queued_spans
from emulator.fake_github import Conclusion, FakeJob, JobSpec, JobStatus
from emulator.fake_github.installations import select_repositories
from emulator.world import OWNER, World
from runner_pool.adapters.github_runner_groups import INSTANT_RUNNER_GROUP
from runner_pool.domain.executions import instance_of_runner
from runner_pool.domain.labels import instant_label
from runner_pool.domain.lifecycle import InstanceState
from tests.e2e.conftest import accounted, e2e_world, eventually, provisions_bound

pytestmark = pytest.mark.slow

TIER = 2
BURST_PROVISIONS = 2
"""Provisions a burst of the tier's jobs may start: one for the first batch, one follow-up for the rest."""
LABEL = instant_label("large")
REPOSITORY = f"{OWNER}/app"


@pytest.fixture
def system(tmp_path: Path) -> Iterator[World]:
    """An organisation installation registering in runner groups, whose class `large` keeps an instant
    tier of TIER runners."""
    with e2e_world(tmp_path, warm_pool_minimum={"large": {"instant": TIER}}) as running:
        yield running


def tier_job_provisions(system: World) -> list[list[int]]:
    """The job ids of each provision the tier's queued jobs started (refresh's top-ups name no job)."""
    stepfunctions = system.stack.stepfunctions
    inputs = [
        json.loads(stepfunctions.describe_execution(executionArn=e["executionArn"])["input"])
        for e in system.stack.executions()
        if e["machine"] == "provision"
    ]
    return [i["job_ids"] for i in inputs if i["run_key"] == LABEL and i["job_ids"]]


def waiting_runners(system: World) -> list[int]:
    """The tier's runners GitHub has, idle and listening: online, not busy, with the tier's label."""
    with system.github.state.lock:
        return [
            runner.runner_id
            for runner in system.github.state.runners.values()
            if runner.online and not runner.busy and LABEL in runner.label_names
        ]


def queued_jobs(system: World) -> int:
    with system.github.state.lock:
        return sum(1 for job in system.github.state.jobs.values() if job.status is JobStatus.QUEUED)


def tier_ready(system: World, size: int = TIER) -> None:
    eventually(lambda: len(waiting_runners(system)) >= size, f"{size} instant runners to wait", 60.0)


def ended(system: World, instance_id: str) -> bool:
    record = system.records.get(instance_id)
    return record is None or record.state is InstanceState.TERMINATED


def test_a_job_on_the_generic_label_runs_on_a_waiting_runner_and_its_instance_is_replaced(
    system: World,
) -> None:
    # Given the tier's runners waiting, registered in the organisation's instant runner group
    tier_ready(system)
    groups = [g.name for g in system.github.state.groups_of(OWNER)]
    assert INSTANT_RUNNER_GROUP in groups
    waiting = waiting_runners(system)
    # When a job asks for the generic label
    # (long enough for its start to be followed, webhook and release check, on a loaded machine)
    run = system.github.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL, seconds=45.0)])
    job: FakeJob = system.github.state.jobs[run.job_ids[0]]
    eventually(lambda: job.status is not JobStatus.QUEUED, "the job to start", 30.0)
    # Then it started on a runner that was registered and listening before the job was queued: nothing
    # of ours (no webhook, no provision) was on its path
    assert job.runner_id in waiting
    assert job.started_at is not None
    instance_id = instance_of_runner(job.runner_name)
    assert instance_id is not None
    # And its start is followed: the record names the job's repository while the job runs
    eventually(
        lambda: getattr(system.records.get(instance_id), "repository", None) == REPOSITORY,
        "the job's start to be noted on its instance",
        45.0,
    )
    eventually(lambda: job.status is JobStatus.COMPLETED, "the job to complete", 90.0)
    assert job.conclusion is Conclusion.SUCCESS
    # And its instance is terminated after its job, never pooled
    eventually(lambda: ended(system, instance_id), f"{instance_id} to be terminated", 60.0)
    # And the tier is refilled to its size
    tier_ready(system)
    assert len(waiting_runners(system)) <= TIER + queued_jobs(system)
    accounted(system)


def test_twice_the_tiers_size_of_jobs_at_once_are_all_served(system: World) -> None:
    # Given the tier's runners waiting
    tier_ready(system)
    # When twice its size of jobs ask for the generic label at once
    jobs = [JobSpec(f"build-{n}", LABEL, seconds=0.3) for n in range(2 * TIER)]
    run = system.github.actions.start_run(REPOSITORY, "matrix", jobs)
    # Then every one of them ran, each on an instance of its own
    eventually(lambda: run.status is JobStatus.COMPLETED, "the run to complete", 90.0)
    served = [system.github.state.jobs[job_id] for job_id in run.job_ids]
    assert all(job.conclusion is Conclusion.SUCCESS for job in served)
    instances = {instance_of_runner(job.runner_name) for job in served}
    assert len(instances) == 2 * TIER
    # And the burst's demand was batched: each job asked the tier for one runner, once, in two provisions
    # (the first at once, the rest in one follow-up), unless its deliveries came so far apart on this busy
    # machine that a follow-up window closed between them (provisions_bound, as for a run's matrix)
    asked = tier_job_provisions(system)
    assert sorted(job_id for job_ids in asked for job_id in job_ids) == sorted(run.job_ids)
    assert len(asked) <= max(BURST_PROVISIONS, provisions_bound(queued_spans(system)[run.run_id]))
    # And the tier waits at its size again, every instance that served terminated
    for instance_id in instances:
        assert instance_id is not None
        eventually(partial(ended, system, instance_id), f"{instance_id} to be terminated", 60.0)
    tier_ready(system)
    assert len(waiting_runners(system)) <= TIER + queued_jobs(system)
    accounted(system)


def test_a_waiting_runner_whose_instance_dies_is_deleted_and_replaced(system: World) -> None:
    # Given the tier's runners waiting
    tier_ready(system)
    runner_id, instance_id = a_waiting_runner(system)
    # When one's instance dies where it stands (EC2 still runs it; its runner falls silent)
    system.instances.crash(instance_id)
    # Then GitHub's runner is deleted once GitHub shows it offline, the instance is terminated, and the
    # tier waits at its size again with a new runner
    deleted_and_replaced(system, runner_id, instance_id)


def a_waiting_runner(system: World) -> tuple[int, str]:
    """One of the tier's waiting runners, and its instance."""
    runner_id = waiting_runners(system)[0]
    with system.github.state.lock:
        name = system.github.state.runners[runner_id].name
    instance_id = instance_of_runner(name)
    assert instance_id is not None
    return runner_id, instance_id


def deleted_and_replaced(system: World, runner_id: int, instance_id: str) -> None:
    """Wait for the runner to be deleted at GitHub, its instance terminated, and the tier at its size
    again with another runner; then the accounting check."""
    eventually(lambda: runner_id not in system.github.state.runners, f"runner {runner_id} deleted", 60.0)
    eventually(lambda: ended(system, instance_id), f"{instance_id} to be terminated", 60.0)
    tier_ready(system)
    assert runner_id not in waiting_runners(system)
    accounted(system)


def test_a_repository_outside_a_selecting_installation_takes_no_tier_runner_until_it_is_added(
    system: World,
) -> None:
    state = system.github.state
    outside = f"{OWNER}/outside"
    inside_id, outside_id = state.repository_id(REPOSITORY), state.repository_id(outside)

    def tier_group_selects(repository_ids: set[int]) -> bool:
        group = next((g for g in state.groups_of(OWNER) if g.name == INSTANT_RUNNER_GROUP), None)
        return group is not None and (group.visibility, group.selected_repository_ids) == (
            "selected",
            repository_ids,
        )

    # Given the owner narrows the App's installation to one repository of the organisation
    select_repositories(system.github, OWNER, {REPOSITORY})
    eventually(lambda: tier_group_selects({inside_id}), "the tier group to select that repository", 60.0)
    tier_ready(system)
    # When a job of another repository asks for the tier's label, then one of the installation's
    stray_run = system.github.actions.start_run(outside, "ci", [JobSpec("build", LABEL, seconds=0.3)])
    stray = state.jobs[stray_run.job_ids[0]]
    run = system.github.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL, seconds=0.3)])
    job = state.jobs[run.job_ids[0]]
    # Then the installation's job runs on a tier runner, while the older one, which GitHub offers a runner
    # first when it may take it, is still queued: the tier's group does not admit its repository
    eventually(lambda: job.status is JobStatus.COMPLETED, "the installation's job to complete", 60.0)
    assert instant_of(job) is not None
    assert stray.status is JobStatus.QUEUED
    assert stray.runner_id is None
    # When the owner adds that repository to the installation
    select_repositories(system.github, OWNER, {REPOSITORY, outside})
    # Then the tier's group admits it, and its job runs on a tier runner
    eventually(lambda: tier_group_selects({inside_id, outside_id}), "the tier group to add it", 60.0)
    eventually(lambda: stray.status is JobStatus.COMPLETED, "its job to complete", 60.0)
    assert stray.conclusion is Conclusion.SUCCESS
    instance_id = instant_of(stray)
    assert instance_id is not None
    eventually(lambda: ended(system, instance_id), f"{instance_id} to be terminated", 60.0)
    tier_ready(system)
    accounted(system)


def instant_of(job: FakeJob) -> str | None:
    """The instance of the tier runner a job ran on, if it ran on one."""
    return instance_of_runner(job.runner_name) if LABEL in job.runner_labels else None


def test_a_waiting_runner_that_exits_is_deleted_and_its_instance_replaced(system: World) -> None:
    # Given the tier's runners waiting
    tier_ready(system)
    runner_id, instance_id = a_waiting_runner(system)
    pid = system.instances.instances()[instance_id].runner_pid()
    assert pid is not None
    # When its runner exits before any job (the instance and its agent live on)
    os.kill(pid, signal.SIGKILL)
    # Then GitHub's runner is deleted, the instance is terminated, never pooled, and the tier waits at its
    # size again with a new runner
    deleted_and_replaced(system, runner_id, instance_id)


def test_replacements_asked_for_jobs_that_were_cancelled_are_taken_back_to_the_tiers_size(
    system: World,
) -> None:
    # Given the tier's runners waiting
    tier_ready(system)
    # When one more job than the tier holds asks for it, and the run is cancelled once the tier's runners
    # took theirs: each job had asked for a replacement, the one still queued among them
    jobs = [JobSpec(f"build-{n}", LABEL, seconds=30.0) for n in range(TIER + 1)]
    run = system.github.actions.start_run(REPOSITORY, "matrix", jobs)

    def started() -> list[int]:
        """The run's jobs in progress now: `eventually` asks again at each look."""
        return [
            job_id
            for job_id in run.job_ids
            if system.github.state.jobs[job_id].status is JobStatus.IN_PROGRESS
        ]

    eventually(lambda: len(started()) == TIER, "the tier's runners to take their jobs", 30.0)
    system.github.actions.cancel_run(run.run_id)
    # Then the replacements beyond its size are taken back: the tier waits at its size, no more, with no
    # job queued for it
    eventually(
        lambda: len(waiting_runners(system)) == TIER and all_ended_but_tier(system),
        "the tier to be back at its size",
        90.0,
    )
    assert not any(job.status is JobStatus.QUEUED for job in system.github.state.jobs.values())
    accounted(system)


def all_ended_but_tier(system: World) -> bool:
    """Only the tier's waiting instances hold its label: every other one has ended."""
    holding = [r for r in system.records.live() if r.run_key == LABEL]
    return len(holding) == TIER
