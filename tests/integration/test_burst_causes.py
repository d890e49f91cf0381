"""Why a burst's executions failed and what became of its unserved jobs (demo/burst.py), read from
execution histories and jobs alone.

The histories are built in the shape moto 5.2's interpreter gives GetExecutionHistory for our provision
machine (a Lambda task's error as `TaskFailed`, the failing state's exit carrying what the Catch put at
`$.error`), as the Step Functions API reference gives each HistoryEvent
(docs.aws.amazon.com/step-functions/latest/apireference/API_HistoryEvent.html).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from bench.burst import Footprint, table_of
from demo.burst import (
    CAUSE_CHARACTERS,
    INSTANCE_END_SECONDS,
    Burst,
    failure_cause,
    short_error,
    unserved_outcome,
)
from emulator.fake_github import Conclusion, FakeJob, JobStatus
from emulator.timeline import Happening, TimelineEvent
from runner_pool.domain.executions import runner_name

INSTANCE = "i-0123456789abcdef0"
PLAN = {"plan": {"slots": [1, 2]}}


def lambda_cause(error_type: str, message: str) -> str:
    """A Lambda function error's Cause, as Lambda reports a raised exception: JSON of its type and message."""
    return json.dumps({"errorType": error_type, "errorMessage": message})


class History:
    """An execution's history events, numbered as GetExecutionHistory numbers them."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.add("ExecutionStarted", executionStartedEventDetails={"input": "{}"})

    def add(self, event_type: str, **details: Any) -> History:
        self.events.append({"type": event_type, "id": len(self.events) + 1, **details})
        return self

    def entered(self, kind: str, name: str, document: dict[str, Any]) -> History:
        return self.add(
            f"{kind}StateEntered", stateEnteredEventDetails={"name": name, "input": json.dumps(document)}
        )

    def exited(self, kind: str, name: str, document: dict[str, Any]) -> History:
        return self.add(
            f"{kind}StateExited", stateExitedEventDetails={"name": name, "output": json.dumps(document)}
        )

    def task_failed(self, error: str, cause: str) -> History:
        details = {"resourceType": "lambda", "resource": "invoke", "error": error, "cause": cause}
        return self.add("TaskFailed", taskFailedEventDetails=details)

    def caught_by_dump(self, kind: str, state: str, error: str, cause: str) -> History:
        """`state` failed its retries; its Catch put the error at `$.error` and went to Dump."""
        caught = {**PLAN, "error": {"Error": error, "Cause": cause}}
        return self.exited(kind, state, caught).entered("Task", "Dump", caught)

    def dumped(self) -> History:
        """Dump succeeded, and the execution ended in the Dumped Fail state."""
        self.exited("Task", "Dump", {"dumped": True}).entered("Fail", "Dumped", {})
        details = {
            "error": "ProvisionFailed",
            "cause": "An unhandled error; what this execution held was dumped.",
        }
        return self.add("ExecutionFailed", executionFailedEventDetails=details)


def claim_failed(instance_id: str) -> History:
    """A claim worker's Lambda raised; the Map failed with its error, was caught and dumped."""
    cause = lambda_cause("ClaimLost", f"claim of {instance_id} lost\nwhile handing it over")
    return (
        History()
        .entered("Task", "Begin", {})
        .exited("Task", "Begin", PLAN)
        .entered("Map", "ClaimWorkers", PLAN)
        .add("MapIterationStarted", mapIterationStartedEventDetails={"name": "ClaimWorkers", "index": 0})
        .entered("Task", "Claim", {**PLAN, "slot": 1})
        .task_failed("ClaimLost", cause)
        .add("MapIterationFailed", mapIterationFailedEventDetails={"name": "ClaimWorkers", "index": 0})
        .add("MapStateFailed")
        .caught_by_dump("Map", "ClaimWorkers", "ClaimLost", cause)
        .dumped()
    )


def test_a_caught_lambda_error_is_named_by_the_state_that_failed_and_its_first_line() -> None:
    # Given a provision whose Map failed on a claim worker's error, caught and dumped
    events = claim_failed(INSTANCE).events

    # When its cause is read
    cause = failure_cause(events)

    # Then it is the Map state's caught error, not the Fail state's, with the message's first line
    assert cause == "ClaimWorkers: ClaimLost: claim of i-… lost"


def test_failures_of_one_kind_on_different_instances_count_as_one_cause() -> None:
    # Given two provisions that failed alike, on two instances
    histories = [claim_failed(INSTANCE).events, claim_failed("i-0fedcba9876543210").events]

    # When their causes are counted
    causes = Counter(failure_cause(events) for events in histories)

    # Then they are one cause, twice
    assert causes == Counter({"ClaimWorkers: ClaimLost: claim of i-… lost": 2})


def test_lambda_timeouts_of_different_requests_count_as_one_cause() -> None:
    # Given two claim workers' steps that ran past their function's timeout, as Lambda reports it
    timed_out = [
        lambda_cause("Sandbox.Timedout", f"RequestId: {request} Error: Task timed out after 30.00 seconds")
        for request in ("local-3791", "0f3c2a52-63f1-4b8e-9d0e-7c1d1a7e2b11")
    ]

    # When each is shortened
    texts = {short_error("Sandbox.Timedout", cause) for cause in timed_out}

    # Then they are one text, without their request ids
    assert texts == {"Sandbox.Timedout: RequestId: … Error: Task timed out after 30.00 seconds"}


def test_a_dump_that_failed_after_the_caught_error_is_told_after_it() -> None:
    # Given a Create step whose error was caught, then a Dump that failed its retries (no Catch on Dump)
    runtime = (
        "An error occurred while executing the state 'Dump' (entered at the event id #412). KeyError('plan')"
    )
    events = (
        History()
        .entered("Task", "Create", PLAN)
        .task_failed("RuntimeError", lambda_cause("RuntimeError", "fleet said no"))
        .caught_by_dump("Task", "Create", "RuntimeError", lambda_cause("RuntimeError", "fleet said no"))
        .task_failed("States.Runtime", "KeyError('plan')")
        .add("ExecutionFailed", executionFailedEventDetails={"error": "States.Runtime", "cause": runtime})
        .events
    )

    # When its cause is read
    cause = failure_cause(events)

    # Then both are told: the error caught, then the one that ended the execution, its event number masked
    assert cause == (
        "Create: RuntimeError: fleet said no; then Dump: States.Runtime: An error occurred while executing "
        "the state 'Dump' (entered at the event id #…). KeyError('plan')"
    )


def test_an_execution_that_timed_out_names_the_state_it_was_in() -> None:
    # Given a provision that timed out while it waited for its fleet, nothing caught
    events = (
        History()
        .entered("Task", "Create", PLAN)
        .exited("Task", "Create", PLAN)
        .entered("Wait", "WaitForFleet", PLAN)
        .add("ExecutionTimedOut", executionTimedOutEventDetails={})
        .events
    )

    # When its cause is read
    cause = failure_cause(events)

    # Then it is the state it was in and the timeout, which has no error of its own
    assert cause == "WaitForFleet: TimedOut"


def test_an_execution_stopped_by_its_world_says_it_was_aborted() -> None:
    # Given a provision stopped (StopExecution) while a claim worker waited for a registration
    events = (
        History()
        .entered("Map", "ClaimWorkers", PLAN)
        .entered("Wait", "WaitForRegistration", {})
        .add("ExecutionAborted", executionAbortedEventDetails={"error": "", "cause": ""})
        .events
    )

    # When its cause is read
    cause = failure_cause(events)

    # Then it says aborted, in the state it was in
    assert cause == "WaitForRegistration: Aborted"


def test_a_refused_request_is_named_by_begin_and_its_error() -> None:
    # Given a Begin that refused its request: caught into the Refused Fail state, not Dump
    caught = {"error": {"Error": "LabelError", "Cause": lambda_cause("LabelError", "no class 'huge'")}}
    events = (
        History()
        .entered("Task", "Begin", {})
        .exited("Task", "Begin", caught)
        .entered("Fail", "Refused", caught)
        .add("ExecutionFailed", executionFailedEventDetails={"error": "ProvisionRefused", "cause": "..."})
        .events
    )

    # When its cause is read
    cause = failure_cause(events)

    # Then it is Begin's error
    assert cause == "Begin: LabelError: no class 'huge'"


def test_a_cause_that_is_not_a_lambda_errors_json_gives_its_first_line_cut_short() -> None:
    # Given Lambda's service refusing the invocation: a Cause of plain text, longer than a row may be
    cause = "Rate Exceeded. " + "x" * 200 + " (Service: AWSLambda; Status Code: 429)\nmore"

    # When it is shortened
    text = short_error("Lambda.TooManyRequestsException", cause)

    # Then it is the error and the Cause's first line, cut at the limit with an ellipsis
    assert text.startswith("Lambda.TooManyRequestsException: Rate Exceeded. xxx")
    assert len(text) == CAUSE_CHARACTERS
    assert text.endswith("…")


def job(status: JobStatus, conclusion: Conclusion | None = None, **runner: Any) -> FakeJob:
    return FakeJob(
        1, 1, "shard (1)", ["self-hosted"], 0.5, 0.0, status=status, conclusion=conclusion, **runner
    )


@pytest.mark.parametrize(
    ("unserved", "outcome"),
    [
        (
            job(JobStatus.COMPLETED, Conclusion.FAILURE, runner_name=runner_name(INSTANCE, "claim")),
            "completed, failure, on a runner of ours; its record never seen",
        ),
        (job(JobStatus.COMPLETED, Conclusion.FAILURE), "completed, failure, no runner"),
        (
            job(
                JobStatus.COMPLETED,
                Conclusion.FAILURE,
                runner_name=runner_name(INSTANCE, "claim"),
                failed_because="its runner was silent for 6 s",
            ),
            "completed, failure (its runner was silent for 6 s), on a runner of ours; its record never seen",
        ),
        (
            job(JobStatus.COMPLETED, Conclusion.SUCCESS, runner_name="someone-elses-runner"),
            "completed, success, on a runner not ours",
        ),
        (job(JobStatus.QUEUED, assigned_runner_id=7), "queued, offered to a runner, not taken"),
        (
            job(JobStatus.IN_PROGRESS, runner_name=runner_name(INSTANCE, "claim")),
            "in_progress, on a runner of ours; its record never seen",
        ),
    ],
)
def test_an_unserved_jobs_outcome_is_its_status_conclusion_and_whose_runner(
    unserved: FakeJob, outcome: str
) -> None:
    # Given a job that did not end in success on a runner of ours
    # When its outcome is read
    # Then it says how it ended and whose runner, if any, had it
    assert unserved_outcome(unserved) == outcome


def test_a_job_whose_instance_was_terminated_as_it_failed_says_so_with_the_records_last_state() -> None:
    # Given a job that failed on a runner of ours, started at 100 s and failed at 110 s
    failed = job(JobStatus.COMPLETED, Conclusion.FAILURE, runner_name=runner_name(INSTANCE, "claim"))
    failed.started_at, failed.completed_at = 100.0, 110.0
    # And its instance's record seen created, then expired before the job failed, then terminated
    # within the shutdown's grace after it (the timeline records a termination once the agent stopped)
    events = [
        TimelineEvent(90.0, Happening.STATE, INSTANCE, detail="created"),
        TimelineEvent(105.0, Happening.STATE, INSTANCE, detail="expired"),
        TimelineEvent(
            110.0 + INSTANCE_END_SECONDS - 1, Happening.TERMINATED, INSTANCE, detail="EC2 says terminated"
        ),
        TimelineEvent(130.0, Happening.STATE, INSTANCE, detail="terminated"),
    ]

    # When its outcome is read
    outcome = unserved_outcome(failed, events)

    # Then it names the record's last state before the job ended, and the termination with the job
    assert outcome == (
        "completed, failure, on a runner of ours; its record last seen expired; its instance terminated with the job"
    )


def test_an_instance_terminated_long_after_its_job_failed_is_not_said_to_have_ended_with_it() -> None:
    # Given a job that failed on a runner of ours at 110 s, its record running until then
    failed = job(JobStatus.COMPLETED, Conclusion.FAILURE, runner_name=runner_name(INSTANCE, "claim"))
    failed.started_at, failed.completed_at = 100.0, 110.0
    # And its instance terminated later than a shutdown's grace after (released, then retired)
    events = [
        TimelineEvent(95.0, Happening.STATE, INSTANCE, detail="running"),
        TimelineEvent(
            110.0 + INSTANCE_END_SECONDS + 1, Happening.TERMINATED, INSTANCE, detail="EC2 says terminated"
        ),
    ]

    # When its outcome is read
    outcome = unserved_outcome(failed, events)

    # Then the termination is not put with the job
    assert outcome == "completed, failure, on a runner of ours; its record last seen running"


def test_the_burst_table_has_a_row_for_each_cause_and_outcome_the_most_frequent_first() -> None:
    # Given a burst with two kinds of failed execution, executions still running, one kind of unserved job
    causes = Counter(
        {"provision Create: RuntimeError: fleet said no": 1, "provision ClaimWorkers: ClaimLost": 3}
    )
    burst = Burst(
        10,
        8,
        1.0,
        10,
        0,
        4,
        failure_causes=causes,
        still_running=Counter({"release": 7, "provision": 1}),
        unserved=Counter({"queued, no runner": 2}),
    )

    # When its table is made
    rows = table_of(burst, 10, Footprint()).rows

    # Then each cause follows the count of failed executions, then those still running by machine
    at = rows.index(("executions failed", "4"))
    assert rows[at + 1 : at + 4] == [
        ("  provision ClaimWorkers: ClaimLost", "3"),
        ("  provision Create: RuntimeError: fleet said no", "1"),
        ("  executions still running when the burst ended (not counted)", "provision: 1, release: 7"),
    ]
    # And each outcome follows the jobs served
    at = rows.index(("jobs served", "8 of 10"))
    assert rows[at + 1] == ("  not served: queued, no runner", "2")


def test_a_burst_without_failures_or_unserved_jobs_says_none_for_each() -> None:
    # Given a burst that served every job and whose executions all succeeded
    burst = Burst(10, 10, 1.0, 10, 0, 0)

    # When its table is made
    rows = table_of(burst, 10, Footprint()).rows

    # Then each breakdown is one row saying there is none
    assert ("  not served, by what became of them", "none") in rows
    assert ("  failed, by machine, state and error", "none") in rows
