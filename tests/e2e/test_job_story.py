"""`runner-pool job <URL>` on the emulator's stack: the story of a cold job and of the warm job after it,
told from the records the stack itself wrote (ledger, executions, state table) and GitHub's job."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from emulator.fake_github import FakeWorkflowRun, JobSpec
from emulator.world import REPOSITORY, World
from runner_pool.adapters.job_records import JobSources
from runner_pool.domain.clock import SystemClock
from runner_pool.domain.executions import instance_of_runner
from runner_pool.job_command import JobTarget, job
from runner_pool.logs_command import logs
from tests.e2e.conftest import LABEL, completed, eventually, job_of, settled

pytestmark = pytest.mark.slow

SERVED = ["queued", "demand", "batch", "hand-over", "started", "ended", "release", "scrub"]
"""The steps of a job that was served, in the order they happen. `ready` (the provision's check that saw
its runner registered) is not among them: GitHub may start the job before that check comes round."""


def target_of(system: World) -> JobTarget:
    """The job command's target as the stack's outputs and functions' environment would give it."""
    settings = system.stack.plane.settings
    sources = JobSources(
        state_table=settings.table_name,
        ledger_table=settings.require("idempotency_table_name", "the job story"),
        provision_machine_arn=settings.require("provision_state_machine_arn", "the job story"),
        release_machine_arn=settings.require("release_state_machine_arn", "the job story"),
    )
    return JobTarget(sources, settings.config, log_group=system.stack.job_log_group)


def job_url(run: FakeWorkflowRun) -> str:
    return f"https://github.com/{REPOSITORY}/actions/runs/{run.run_id}/job/{run.job_ids[0]}"


def story(system: World, run: FakeWorkflowRun, *, as_json: bool = True, whole_run: bool = False) -> Any:
    """What the job command prints for the run's first job (`whole_run`: for the run's URL)."""
    out = io.StringIO()
    url = f"https://github.com/{REPOSITORY}/actions/runs/{run.run_id}"
    url += "" if whole_run else f"/job/{run.job_ids[0]}"
    code = job(target_of(system), url, system.aws.client, SystemClock(), out, as_json=as_json)
    assert code == 0, out.getvalue()
    return json.loads(out.getvalue()) if as_json else out.getvalue()


def logged(system: World, run: FakeWorkflowRun) -> Any:
    """What `runner-pool logs --json` prints for the run's first job."""
    out = io.StringIO()
    code = logs(target_of(system), job_url(run), system.aws.client, SystemClock(), out, as_json=True)
    assert code == 0, out.getvalue()
    return json.loads(out.getvalue())


def messages(told: dict[str, Any], source: str) -> list[str]:
    return [line["message"] for line in told["lines"] if line["source"] == source]


def served_in_order(told: dict[str, Any]) -> list[str]:
    return [step["what"] for step in told["steps"] if step["what"] in SERVED]


def test_the_story_of_a_cold_job_and_of_the_warm_job_that_reused_its_instance(system: World) -> None:
    # Given a first run whose job cold-started an instance, and a second run whose job took it warm
    first = completed(system, system.start_run("build", JobSpec("build", LABEL, seconds=0.5)))
    settled(system)
    second = completed(system, system.start_run("test", JobSpec("test", LABEL, seconds=0.5)))
    settled(system)
    instance_id = instance_of_runner(job_of(system, first).runner_name)

    # When the operator asks for each job's story by its URL
    cold, warm = story(system, first), story(system, second)

    # Then the first was served cold and the second warm, on the same instance
    assert (cold["tier"], cold["instance_id"]) == ("cold", instance_id)
    assert (warm["tier"], warm["instance_id"]) == ("warm", instance_id)
    # And each tells every step of a served job, in the order it happened, with no reason to wait
    assert served_in_order(cold) == SERVED, cold
    assert served_in_order(warm) == SERVED, warm
    assert "ready" in [step["what"] for step in cold["steps"]]
    assert "ready" in [step["what"] for step in warm["steps"]]
    assert cold["waiting"] is None
    assert warm["waiting"] is None
    steps = {step["what"]: step for step in cold["steps"]}
    assert steps["creation"]["detail"] == "CreateFleet for 1: launched 1"
    assert "verified clean (UD_REMOVE_REG_OK)" in steps["scrub"]["detail"]
    warm_steps = {step["what"]: step for step in warm["steps"]}
    assert "claimed from the pool" in warm_steps["hand-over"]["detail"]
    assert "verified clean (UD_REMOVE_REG_OK)" in warm_steps["scrub"]["detail"]
    # And each step's wait is its time since the latest step before it (none below 0: GitHub's times are
    # whole seconds, and its start is told after the hand-over of the same second)
    for told in (cold, warm):
        timed = [step for step in told["steps"] if step["at"] is not None]
        for index, step in enumerate(timed[1:], start=1):
            latest = max(earlier["at"] for earlier in timed[:index])
            assert step["wait_seconds"] == pytest.approx(max(0.0, step["at"] - latest)), timed
    # And the run's URL tells each of its jobs' stories, here its one job's
    assert [told["ref"]["job_id"] for told in story(system, second, whole_run=True)] == second.job_ids
    # And the text form tells the same story, headed by the job and its instance
    text = story(system, second, as_json=False)
    assert text.splitlines()[0] == (
        f"job {second.job_ids[0]} of run {second.run_id} in {REPOSITORY} on {instance_id}, warm"
    )
    assert text.splitlines()[-1].endswith(f"runner-pool logs {job_url(second)}")

    # When the operator asks for each job's lines (the agent sends its last ones within a second)
    def both_scrubs_shipped() -> tuple[Any, Any] | None:
        cold_lines, warm_lines = logged(system, first), logged(system, second)
        done = all("workspace clean" in messages(told, "agent") for told in (cold_lines, warm_lines))
        return (cold_lines, warm_lines) if done else None

    cold_lines, warm_lines = eventually(both_scrubs_shipped, "both hand-overs' lines in the log group")
    # Then each is its own hand-over's, on the one instance: the agent's from the runner's start to the
    # scrub, and the runner's diagnostic lines, each carrying that hand-over's runner
    for told, run in ((cold_lines, first), (warm_lines, second)):
        runner_id = job_of(system, run).runner_id
        assert (told["instance_id"], told["runner_id"]) == (instance_id, runner_id)
        assert {line["runner_id"] for line in told["lines"]} == {runner_id}
        assert {"starting the runner", "runner listening for jobs", "workspace clean"} <= set(
            messages(told, "agent")
        )
        assert any(f"Running job: {job_of(system, run).name}" in line for line in messages(told, "runner"))
        assert [line["at"] for line in told["lines"]] == sorted(line["at"] for line in told["lines"])
    # And neither shows the other job's lines, though the instance ran both
    assert not any("Running job: test" in line for line in messages(cold_lines, "runner"))
    assert not any("Running job: build" in line for line in messages(warm_lines, "runner"))
