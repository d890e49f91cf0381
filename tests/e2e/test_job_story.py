"""`runner-pool job <URL>` on the emulator's stack: the story of a cold job and of the warm job after it,
told from the records the stack itself wrote (ledger, executions, state table) and GitHub's job; and
`runner-pool connect`, which finds a job's instance through that story (no session is started here: the
emulator has no Systems Manager, so the command is printed and its refusals checked)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from emulator import iam_check
from emulator.fake_github import FakeWorkflowRun, JobSpec
from emulator.world import REPOSITORY, World
from runner_pool.connect_command import connect
from runner_pool.domain.clock import SystemClock
from runner_pool.domain.executions import instance_of_runner
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.job_command import job
from runner_pool.logs_command import logs
from tests.e2e.conftest import LABEL, SWEEP_LOOK_SECONDS, awaited, completed, job_of, settled

pytestmark = pytest.mark.slow

SERVED = ["queued", "demand", "batch", "hand-over", "started", "ended", "release", "scrub"]
"""The steps of a job that was served, in the order they happen. `ready` (the provision's check that saw
its runner registered) is not among them: GitHub may start the job before that check comes round."""


def job_url(run: FakeWorkflowRun) -> str:
    return f"https://github.com/{REPOSITORY}/actions/runs/{run.run_id}/job/{run.job_ids[0]}"


def story(system: World, run: FakeWorkflowRun, *, as_json: bool = True, whole_run: bool = False) -> Any:
    """What the job command prints for the run's first job (`whole_run`: for the run's URL)."""
    out = io.StringIO()
    url = f"https://github.com/{REPOSITORY}/actions/runs/{run.run_id}"
    url += "" if whole_run else f"/job/{run.job_ids[0]}"
    code = job(system.job_target(), url, system.aws.client, SystemClock(), out, as_json=as_json)
    assert code == 0, out.getvalue()
    return json.loads(out.getvalue()) if as_json else out.getvalue()


def logged(system: World, run: FakeWorkflowRun) -> Any:
    """What `runner-pool logs --json` prints for the run's first job."""
    out = io.StringIO()
    code = logs(system.job_target(), job_url(run), system.aws.client, SystemClock(), out, as_json=True)
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

    cold_lines, warm_lines = awaited(system, both_scrubs_shipped, "both hand-overs' lines in the log group")
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


def connect_to(system: World, named: str, *, print_only: bool = True) -> tuple[int, str]:
    """What `runner-pool connect` answers for `named`, as an operator without the session-manager-plugin."""
    out = io.StringIO()
    code = connect(
        system.job_target(),
        named,
        system.aws.client,
        SystemClock(),
        out,
        print_only=print_only,
        which=no_tool,
    )
    return code, out.getvalue()


def no_tool(_name: str) -> None:
    return None


def test_connect_finds_a_jobs_instance_by_its_url_and_refuses_what_it_may_not_open(
    system: World, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a run of two jobs: one of class large (SSM off), one of xlarge, which lets Session Manager in
    run = completed(
        system,
        system.start_run(
            "connect",
            JobSpec("plain", LABEL, seconds=0.5),
            JobSpec("reachable", LABEL.replace("class=large", "class=xlarge"), seconds=0.5),
        ),
    )
    settled(system)
    plain, reachable = (instance_of_runner(job_of(system, run, n).runner_name) for n in (0, 1))
    assert plain is not None
    assert reachable is not None
    assert plain != reachable
    # And each instance's agent ran as its launch template's role, the xlarge one as the session role
    check = iam_check.installed_check()
    assert check is not None
    launched = system.instances.instances()
    roles = {i: check.iam.instance_role(launched[i].launch_template) for i in (plain, reachable)}
    assert roles[plain] != roles[reachable]
    session_actions = {
        a for s in check.iam.role(roles[reachable], name="session").statements for a in s.actions
    }
    assert "ssmmessages:OpenDataChannel" in session_actions
    assert not any(
        a.startswith("ssm") for s in check.iam.role(roles[plain], name="plain").statements for a in s.actions
    )
    url = f"https://github.com/{REPOSITORY}/actions/runs/{run.run_id}"
    region = system.aws.client("dynamodb").meta.region_name
    capsys.readouterr()

    # When the operator connects to the xlarge job by its URL, without the session-manager-plugin
    code, printed = connect_to(system, f"{url}/job/{run.job_ids[1]}", print_only=False)

    # Then the session command for that job's instance is printed, and why it was not started
    assert (code, printed) == (0, f"aws ssm start-session --target {reachable} --region {region}\n")
    assert "session-manager-plugin not installed" in capsys.readouterr().err

    # And the large job's instance is refused: its class has SSM off
    assert connect_to(system, f"{url}/job/{run.job_ids[0]}") == (1, "")
    assert "no session: class large has SSM off" in capsys.readouterr().err

    # And the run's URL lists its jobs' two instances to choose from
    assert connect_to(system, url) == (1, "")
    listed = capsys.readouterr().err
    assert "ran on 2 instances; name one:" in listed
    assert f"job {run.job_ids[0]}: {plain}" in listed
    assert f"job {run.job_ids[1]}: {reachable}" in listed

    # And once the xlarge instance is gone, its id is refused as gone
    assert system.records.expire(reachable, None).succeeded

    def gone() -> bool:
        record = system.records.get(reachable)
        return record is None or record.state is InstanceState.TERMINATED

    awaited(system, gone, "refresh to terminate the expired instance", every=SWEEP_LOOK_SECONDS)
    assert connect_to(system, reachable) == (1, "")
    assert f"no session: {reachable} is gone" in capsys.readouterr().err
