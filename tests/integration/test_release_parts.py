"""A run's release in parts, end to end: the real release ASL in moto's interpreter starting executions of
itself, its tasks on our handlers.

The receipt timeout here is long against its poll (600 s, every second), so a part is two instances
(domain.release.release_part_size) and a handful of instances makes several parts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from emulator.harness.control_plane import (
    LocalControlPlane,
    LocalStateMachine,
    client,
    stack_config,
)
from emulator.harness.release_world import ReleaseAgents, ReleaseRun, run_release
from runner_pool.domain.executions import ReleaseRequest
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import InstanceRecord
from runner_pool.domain.release import release_part_size
from tests.integration.conftest import accounted_plane

RUN = "pool=101"
OTHER_RUN = "pool=202"
TIMEOUTS = {"release_receipt_seconds": 600, "release_receipt_poll_seconds": 1, "idle_seconds": 1200}
RUN_RELEASE = ReleaseRequest(run_key=RUN, cause="run-45-attempt-1")
RUN_RELEASE_NAME = RUN_RELEASE.execution_name

LAMBDA_TIMED_OUT = type("Sandbox.Timedout", (Exception,), {})
"""What Lambda answers for a function that ran past its timeout: its effect may have happened."""


@pytest.fixture
def local() -> Iterator[LocalControlPlane]:
    with accounted_plane(stack_config(timeouts=TIMEOUTS), pause=lambda _seconds: None) as plane:
        yield plane


@pytest.fixture
def release(local: LocalControlPlane) -> LocalStateMachine:
    return local.deploy("release")


def held(local: LocalControlPlane, count: int) -> tuple[list[InstanceRecord], ReleaseAgents]:
    """`count` instances running for the run (their runners registered, none with a job done), and their
    agents, which answer once released."""
    running = local.running(RUN, count=count)
    agents = ReleaseAgents(local)
    for record in running:
        agents.serve(record.instance_id, RUN)
    return running, agents


def given_back(run: ReleaseRun) -> Counter[str]:
    """How many times each instance settled, over every execution of the release."""
    return Counter(
        outcome["instance_id"]
        for execution in run.executions
        for outcome in (execution.output or {}).get("released", [])
    )


def test_a_run_holding_more_than_a_part_is_given_back_in_parts_each_instance_once(
    local: LocalControlPlane, release: LocalStateMachine
) -> None:
    # Given a run holding five instances, more than one part, and another run's instance
    size = release_part_size(local.config.timeouts)
    assert size == 2
    running, agents = held(local, 5)
    (other,) = local.running(OTHER_RUN)
    # When the run is released
    run = run_release(release, RUN_RELEASE.model_dump(mode="json"), on_wait=agents.on_wait)
    # Then the run's release gives back nothing itself and starts three parts, which all succeed ...
    assert run.execution.status == "SUCCEEDED", run.execution.output
    assert "released" not in run.execution.output
    assert len(run.execution.output["names"]) == len(run.parts) == 3
    assert all(part.status == "SUCCEEDED" for part in run.parts.values())
    # ... each giving back at most a part's worth, and every instance of the run pooled exactly once
    assert all(len(part.output["released"]) <= size for part in run.parts.values())
    assert given_back(run) == Counter({record.instance_id: 1 for record in running})
    assert {o["status"] for part in run.parts.values() for o in part.output["released"]} == {"pooled"}
    assert sorted(m.instance_id for m in local.drain_pool("large")) == sorted(r.instance_id for r in running)
    # And the parts are the executions the plan named; the other run's instance is untouched
    assert set(run.parts) == set(run.execution.output["names"])
    assert local.record(other.instance_id) == other


def test_a_run_within_one_part_is_given_back_by_its_own_execution(
    local: LocalControlPlane, release: LocalStateMachine
) -> None:
    # Given a run holding two instances, a part's worth
    running, agents = held(local, 2)
    # When the run is released
    run = run_release(release, RUN_RELEASE.model_dump(mode="json"), on_wait=agents.on_wait)
    # Then it starts no part and gives both back itself
    assert run.parts == {}
    assert given_back(run) == Counter({record.instance_id: 1 for record in running})


def test_starting_the_parts_again_after_its_answer_was_lost_starts_nothing_twice(
    local: LocalControlPlane, release: LocalStateMachine
) -> None:
    # Given a run holding five instances, and a StartParts whose Lambda times out once after starting them
    running, agents = held(local, 5)
    real = release.handlers["start_parts"]
    answers: list[dict[str, Any]] = []

    def times_out_once(event: dict[str, Any], context: Any) -> Any:
        answer = real(event, context)
        answers.append(answer)
        if len(answers) == 1:
            raise LAMBDA_TIMED_OUT("Task timed out after 30.00 seconds")
        return answer

    # When the run is released
    run = run_release(
        release,
        RUN_RELEASE.model_dump(mode="json"),
        name=RUN_RELEASE_NAME,
        on_wait=agents.on_wait,
        replace={"start_parts": times_out_once},
    )
    # Then the retry asked for the same three parts by the same names, and Step Functions ran each once
    assert len(answers) == 2
    assert answers[0]["names"] == answers[1]["names"]
    assert run.execution.status == "SUCCEEDED", run.execution.output
    executions = client("stepfunctions").list_executions(stateMachineArn=release.arn)["executions"]
    assert Counter(execution["name"] for execution in executions) == Counter(
        [RUN_RELEASE_NAME, *answers[0]["names"]]
    )
    # And every instance was given back once, by one part
    assert len(run.parts) == 3
    assert given_back(run) == Counter({record.instance_id: 1 for record in running})


def test_a_redelivered_run_completion_starts_no_second_release(
    local: LocalControlPlane, release: LocalStateMachine
) -> None:
    # Given a run of five instances released in parts
    _running, agents = held(local, 5)
    run_release(
        release, RUN_RELEASE.model_dump(mode="json"), name=RUN_RELEASE.execution_name, on_wait=agents.on_wait
    )
    # When its completion is delivered again, and the dispatcher asks for the same release
    started = local.plane.executions(release_machine_arn=release.arn).release(RUN_RELEASE)
    # Then Step Functions finds the name taken: nothing starts
    assert started is False


def test_parts_that_could_not_be_started_leave_their_instances_for_refresh_to_terminate(
    local: LocalControlPlane, release: LocalStateMachine
) -> None:
    # Given a run holding five instances, and a StartParts that always fails
    running, agents = held(local, 5)

    def broken(_event: dict[str, Any], _context: Any) -> dict[str, Any]:
        raise RuntimeError("Step Functions is unavailable")

    # When the run is released
    run = run_release(
        release, RUN_RELEASE.model_dump(mode="json"), on_wait=agents.on_wait, replace={"start_parts": broken}
    )
    # Then the release ends in its named failure, having given back nothing
    assert run.execution.status == "FAILED"
    (failed,) = [event for event in run.execution.events if event["type"] == "ExecutionFailed"]
    assert failed["executionFailedEventDetails"]["error"] == "ReleasePartsNotStarted"
    assert run.parts == {}
    # And once their thresholds pass, refresh terminates what the run still held
    thresholds = [record.threshold for record in running if record.threshold is not None]
    assert len(thresholds) == len(running)
    local.clock.advance(max(thresholds) + 1 - local.clock.now())
    local.refresh()
    for record in running:
        assert local.record(record.instance_id).state is InstanceState.TERMINATED
        assert local.ec2_state(record.instance_id) in ("shutting-down", "terminated")
