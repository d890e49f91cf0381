"""The local Step Functions harness: our ASL in moto's interpreter, Lambda tasks routed to handlers."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import boto3
import pytest
from moto import mock_aws

from emulator.harness.control_plane import REGION
from emulator.moto_internals import patch_point
from emulator.step_functions import (
    MOTO_CONFIG,
    LocalStateMachines,
    ThrottledError,
    lambdas_in_process,
    render_asl,
    stop_running_executions,
    without_waiting,
)
from emulator.step_functions_quotas import HISTORY_LIMIT_EVENTS, QuotaWatch

ASL = Path(__file__).parent / "asl" / "harness.asl.json"
_EXECUTION_WORKER = "moto.stepfunctions.parser.backend.execution_worker:ExecutionWorker"


class Flaky(Exception):  # noqa: N818 - the error name the ASL's Retry matches
    pass


@pytest.fixture
def machines() -> Iterator[LocalStateMachines]:
    with mock_aws(config=MOTO_CONFIG), without_waiting():  # type: ignore[call-overload]
        yield LocalStateMachines(
            boto3.client("stepfunctions", region_name=REGION),
            boto3.client("lambda", region_name=REGION),
            boto3.client("iam", region_name=REGION),
        )


def deploy(machines: LocalStateMachines) -> str:
    arns = machines.create_functions(["pick", "finish"])
    return machines.create("harness", render_asl(ASL, {"PickArn": arns["pick"], "FinishArn": arns["finish"]}))


def test_map_fans_out_to_the_handler_and_gathers_its_results(machines: LocalStateMachines) -> None:
    # Given handlers that pick every slot at once and echo what they finish with
    handlers = {"pick": lambda event, _c: {**event, "picked": True}, "finish": lambda event, _c: event}
    with lambdas_in_process(handlers) as invocations:
        # When an execution runs over three slots
        execution = machines.run(deploy(machines), {"slots": [1, 2, 3]})
    # Then each slot went through the handler in this process and the results came back
    assert execution.status == "SUCCEEDED"
    assert execution.output["picked"] == [{"slot": n, "picked": True} for n in (1, 2, 3)]
    assert sorted(event["slot"] for event in invocations.of("pick")) == [1, 2, 3]
    # Map, 3 x (Pick, Hold, Picked?, Picked), Finish
    assert execution.state_transitions == 1 + 3 * 4 + 1


def test_a_raised_exception_reaches_the_state_machines_catch(machines: LocalStateMachines) -> None:
    # Given a finishing handler that raises
    def finish(_event: dict[str, Any], _context: Any) -> None:
        raise ValueError("nothing to finish")

    with lambdas_in_process({"pick": lambda e, _c: {**e, "picked": True}, "finish": finish}):
        # When the execution reaches it
        execution = machines.run(deploy(machines), {"slots": [1]})
    # Then the Catch took the error, by the exception's name, as Lambda reports it on AWS
    assert execution.status == "SUCCEEDED"
    assert execution.output["error"]["Error"] == "ValueError"
    assert "nothing to finish" in execution.output["error"]["Cause"]


def test_a_throttled_invocation_fails_the_task_as_lambdas_429_and_its_retry_runs_it(
    machines: LocalStateMachines,
) -> None:
    # Given a task that retries Lambda's throttling alone, and a Lambda that throttles its first two invocations
    arns = machines.create_functions(["busy"])
    task = {
        "Type": "Task",
        "Resource": "arn:aws:states:::lambda:invoke",
        "Parameters": {"FunctionName": arns["busy"], "Payload.$": "$"},
        "Retry": [
            {"ErrorEquals": ["Lambda.TooManyRequestsException"], "MaxAttempts": 2, "IntervalSeconds": 1}
        ],
        "End": True,
    }
    arn = machines.create("throttled", json.dumps({"StartAt": "Busy", "States": {"Busy": task}}))
    invoked: list[int] = []

    def busy(_event: dict[str, Any], _context: Any) -> dict[str, Any]:
        invoked.append(1)
        if len(invoked) <= 2:
            raise ThrottledError("Rate Exceeded.")
        return {"ran": True}

    # When the execution runs
    with lambdas_in_process({"busy": busy}), without_waiting():
        execution = machines.run(arn, {})
    # Then each throttle failed the task as Step Functions names Lambda's 429, and the third try ran it
    failed = [e["taskFailedEventDetails"] for e in execution.events if e["type"] == "TaskFailed"]
    assert [f["error"] for f in failed] == ["Lambda.TooManyRequestsException"] * 2
    assert execution.status == "SUCCEEDED"
    assert len(invoked) == 3


def test_retries_and_waits_take_no_time_in_tests(machines: LocalStateMachines) -> None:
    # Given a pick that fails once with a retryable error, then needs a second look an hour later
    attempts: list[int] = []

    def pick(event: dict[str, Any], _context: Any) -> dict[str, Any]:
        attempts.append(event["slot"])
        if len(attempts) == 1:
            raise Flaky("try again")
        return {**event, "picked": len(attempts) >= 3}

    with lambdas_in_process({"pick": pick, "finish": lambda e, _c: e}):
        # When it runs with a deadline far shorter than the Retry interval (600 s) and Wait (3600 s)
        execution = machines.run(deploy(machines), {"slots": [7]}, timeout_seconds=10)
    # Then the retry and the loop back through the Wait happened, without waiting
    assert execution.status == "SUCCEEDED"
    assert attempts == [7, 7, 7]


# --- AWS's quotas, which moto does not enforce (emulator/step_functions_quotas.py) ---------------


def test_a_state_output_over_256_kib_is_a_quota_breach_that_fails_the_test(
    machines: LocalStateMachines, step_functions_quotas: QuotaWatch
) -> None:
    # Given a pick that returns 300 KiB: over Step Functions' 256 KiB for a state's output
    def pick(event: dict[str, Any], _context: Any) -> dict[str, Any]:
        return {**event, "picked": True, "reason": "x" * (300 * 1024)}

    with lambdas_in_process({"pick": pick, "finish": lambda e, _c: e}):
        # When an execution runs it
        machines.run(deploy(machines), {"slots": [1]})
    # Then the breach was noted, naming the state (the autouse fixture would fail this test on it)
    breaches = step_functions_quotas.take_violations()
    assert any("'Pick'" in breach and "262,144-byte payload quota" in breach for breach in breaches), breaches


def test_a_state_input_over_256_kib_is_a_quota_breach(
    machines: LocalStateMachines, step_functions_quotas: QuotaWatch
) -> None:
    # Given an execution whose input is 300 KiB
    with lambdas_in_process({"pick": lambda e, _c: {**e, "picked": True}, "finish": lambda e, _c: e}):
        machines.run(deploy(machines), {"slots": [1], "ballast": "y" * (300 * 1024)})
    # Then the first state's input breached the quota
    breaches = step_functions_quotas.take_violations()
    assert any("'Slots' input" in breach for breach in breaches), breaches


def test_an_execution_history_past_its_quota_is_a_breach(
    machines: LocalStateMachines, step_functions_quotas: QuotaWatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the history quota (25,000 events on AWS) lowered for the test to 40 events
    assert HISTORY_LIMIT_EVENTS == 25_000
    monkeypatch.setattr(step_functions_quotas, "history_limit", 40)
    # When an execution of 10 slots runs (each slot's Pick, Hold and Choice add several events)
    with lambdas_in_process({"pick": lambda e, _c: {**e, "picked": True}, "finish": lambda e, _c: e}):
        execution = machines.run(deploy(machines), {"slots": list(range(10))})
    # Then the history passed the quota and the breach was noted
    assert execution.status == "SUCCEEDED"
    assert step_functions_quotas.take_violations() == [
        "an execution's history passed Step Functions' 40-event quota"
    ]


class _StopsThatLetTheThreadGo:
    """A Step Functions client whose first stop refused by moto's window lets the held thread go on."""

    def __init__(self, client: Any, may_build: threading.Event) -> None:
        self._client = client
        self._may_build = may_build
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def stop_execution(self, **kwargs: Any) -> Any:
        try:
            return self._client.stop_execution(**kwargs)
        except AttributeError:
            self.refused += 1
            self._may_build.set()
            raise


def test_an_execution_stopped_before_its_thread_got_going_is_stopped_not_an_error(
    machines: LocalStateMachines,
) -> None:
    # Given an execution started whose thread has not yet built what a stop acts on (moto's window)
    owner, name = patch_point(f"{_EXECUTION_WORKER}._get_evaluation_environment")
    building = getattr(owner, name)
    may_build = threading.Event()

    def held(self: Any) -> Any:
        may_build.wait(30)
        return building(self)

    stepfunctions = _StopsThatLetTheThreadGo(boto3.client("stepfunctions", region_name=REGION), may_build)
    stopping_done = threading.Event()
    working = machines.create_functions(["work"])["work"]
    task = {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "End": True}
    definition = {"StartAt": "Work", "States": {"Work": {**task, "Parameters": {"FunctionName": working}}}}
    with (
        lambdas_in_process({"work": lambda event, _c: stopping_done.wait(30)}),
        mock.patch.object(owner, name, held),
    ):
        execution_arn = machines.start(machines.create("held", json.dumps(definition)), {})
        # When the world ends and stops what runs while the thread is still getting going
        stopped = stop_running_executions(stepfunctions)
        stopping_done.set()
        ended = machines.wait(execution_arn)
    # Then the stop waited for the thread and stopped it, as AWS stops one any time after it started
    assert stepfunctions.refused == 1
    assert stopped == 1
    assert ended.status == "ABORTED"
