"""`runner-pool job <URL>` through the CLI against moto: it finds the ledger and the state machines through
the stack's outputs, and tells what they hold, saying what it could not read."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest

from emulator.harness.control_plane import REGION
from emulator.resources import create_idempotency_table
from runner_pool.adapters.demand_ledger import DynamoDbLedger
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.executions import ProvisionRequest, ReleaseRequest
from tests.conftest import TABLE_NAME
from tests.integration.test_cli import STACK, printed

LEDGER = "runner-pool-ledger"
REPOSITORY = "octo-org/app"
RUN_ID = 41
JOB_ID = 4101
URL = f"https://github.com/{REPOSITORY}/actions/runs/{RUN_ID}/job/{JOB_ID}"
ROLE = "arn:aws:iam::123456789012:role/states"
INSTANCE = "i-0123456789abcdef0"
PASS = json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Pass", "End": True}}})


@pytest.fixture
def machines(aws: None) -> dict[str, str]:
    sfn = boto3.client("stepfunctions", region_name=REGION)
    return {
        name: sfn.create_state_machine(name=name, definition=PASS, roleArn=ROLE)["stateMachineArn"]
        for name in ("Provision", "Release")
    }


@pytest.fixture
def stack(dynamodb: Any, machines: dict[str, str]) -> str:
    """A stack whose outputs name the tables and state machines, as the real stack's do."""
    create_idempotency_table(dynamodb, LEDGER)
    template = {
        "Resources": {"Marker": {"Type": "AWS::SQS::Queue"}},
        "Outputs": {
            "StateTableName": {"Value": TABLE_NAME},
            "DemandLedgerTableName": {"Value": LEDGER},
            "ProvisionStateMachineArn": {"Value": machines["Provision"]},
            "ReleaseStateMachineArn": {"Value": machines["Release"]},
        },
    }
    boto3.client("cloudformation", region_name=REGION).create_stack(
        StackName=STACK, TemplateBody=json.dumps(template)
    )
    return STACK


def test_a_counted_job_is_told_from_the_ledger_and_its_provision(
    stack: str, machines: dict[str, str], dynamodb: Any, clock: ManualClock
) -> None:
    # Given a job the dispatcher counted and the provision it started for it
    request = ProvisionRequest(repository=REPOSITORY, run_key=f"pool={RUN_ID}", count=1, job_ids=(JOB_ID,))
    ledger = DynamoDbLedger(LEDGER, clock, dynamodb)
    ledger.reserve(JOB_ID, "dispatch-1", clock.now() + 60)
    ledger.confirm([JOB_ID], "dispatch-1", request.execution_name)
    boto3.client("stepfunctions", region_name=REGION).start_execution(
        stateMachineArn=machines["Provision"], name=request.execution_name, input=request.model_dump_json()
    )

    # When the operator asks for its story as JSON
    code, out = printed("job", URL, "--json", clock=clock)

    # Then it tells the demand and the batch, from the ledger and the execution the ledger names
    assert code == 0, out
    told = json.loads(out)
    steps = {step["what"]: step["detail"] for step in told["steps"]}
    assert steps["demand"] == f"counted by {request.execution_name}"
    assert steps["batch"] == f"{request.execution_name}: 1 runner(s) for 1 job(s) of pool={RUN_ID}"
    # And it says what it could not read: the stack's functions (no config, so no GitHub)
    assert told["ref"] == {"repository": REPOSITORY, "run_id": RUN_ID, "job_id": JOB_ID}
    assert len(told["gaps"]) == 1
    assert told["gaps"][0].startswith("queued time: the stack config is not readable")


def test_the_jobs_redrive_and_release_are_found_among_the_executions_since_its_first_provision(
    stack: str, machines: dict[str, str], dynamodb: Any, clock: ManualClock
) -> None:
    # Given the job's provision, another run's provision, the job's redrive, and releases of the job and
    # of another job
    sfn = boto3.client("stepfunctions", region_name=REGION)
    first = ProvisionRequest(repository=REPOSITORY, run_key=f"pool={RUN_ID}", count=1, job_ids=(JOB_ID,))
    other = first.model_copy(update={"run_key": "pool=42", "job_ids": (4201,)})
    redrive = first.model_copy(update={"redrives": 1})
    ledger = DynamoDbLedger(LEDGER, clock, dynamodb)
    ledger.reserve(JOB_ID, "dispatch-1", clock.now() + 60)
    ledger.confirm([JOB_ID], "dispatch-1", first.execution_name)
    for request in (first, other, redrive):
        sfn.start_execution(
            stateMachineArn=machines["Provision"],
            name=request.execution_name,
            input=request.model_dump_json(),
        )
    releases = [
        ReleaseRequest(run_key=f"pool={RUN_ID}", instance_id=INSTANCE, runner_id=7, cause=f"job-{job_id}")
        for job_id in (JOB_ID, 4201)
    ]
    for release in releases:
        sfn.start_execution(
            stateMachineArn=machines["Release"], name=release.execution_name, input=release.model_dump_json()
        )

    # When the operator asks for the job's story
    code, out = printed("job", URL, "--json", clock=clock)

    # Then its two batches are told, the second as a redrive, and its own release, which names its instance
    assert code == 0, out
    told = json.loads(out)
    batches = [step["detail"] for step in told["steps"] if step["what"] == "batch"]
    assert [batch.split(":")[0] for batch in batches] == [first.execution_name, redrive.execution_name]
    assert "redrive 1" in batches[1]
    told_releases = [step["detail"] for step in told["steps"] if step["what"] == "release"]
    assert told_releases == [f"{releases[0].execution_name} (job-{JOB_ID})"]
    assert told["instance_id"] == INSTANCE


def test_a_job_the_ledger_never_counted_waits_for_its_demand(stack: str, clock: ManualClock) -> None:
    # Given no ledger item for the job (its queued webhook never counted)
    # When the operator asks for its story
    code, out = printed("job", URL, clock=clock)

    # Then the text names the job and says why it waits
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == f"job {JOB_ID} of run {RUN_ID} in {REPOSITORY}"
    assert "  waiting: no demand recorded: the queued webhook was not counted" in out


def test_a_url_that_names_no_job_is_refused(
    stack: str, clock: ManualClock, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = printed("job", f"https://github.com/{REPOSITORY}/pull/3", clock=clock)
    assert code == 2
    assert out == ""
    assert "is not a job or run URL" in capsys.readouterr().err


def test_a_runs_url_without_github_says_only_github_lists_its_jobs(
    stack: str, clock: ManualClock, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a stack whose config (and so the App) cannot be read
    # When the operator asks for a run's story
    code, _ = printed("job", f"https://github.com/{REPOSITORY}/actions/runs/{RUN_ID}", clock=clock)

    # Then it fails, saying why it cannot list the run's jobs
    assert code == 1
    assert f"the jobs of run {RUN_ID} are listed by GitHub only" in capsys.readouterr().err
