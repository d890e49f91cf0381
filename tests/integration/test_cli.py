"""The operator CLI against moto: it finds the pool through the stack's outputs and prints its tables."""

from __future__ import annotations

import io
import json
from typing import Any

import boto3
import pytest

from emulator.harness.control_plane import REGION
from runner_pool.adapters.capacity_waits import CapacityWaits
from runner_pool.adapters.state_table import StateTable
from runner_pool.cli import main
from runner_pool.domain.capacity_waits import Shortfall
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.pool_partitions import PoolPartition
from runner_pool.domain.records import Arch, UsageClass
from runner_pool.domain.timeouts import Timeouts
from runner_pool.prices import gp3_hourly
from tests.conftest import TABLE_NAME
from tests.support import builders

STACK = "RunnerPool"
LARGE = PoolPartition("large", UsageClass.SPOT, Arch.X64)
VOLUME = gp3_hourly(40)
"""The default 40 GiB gp3 root volume an hour ($0.08 a GB-month, runner_pool/prices.py): about $0.0044."""


def usd(amount: float) -> str:
    return f"{amount:.5f}".rstrip("0").rstrip(".")


@pytest.fixture
def stack(dynamodb: Any, pool_queue_url_prefix: str, config: StackConfig) -> str:
    """A CloudFormation stack whose outputs name the test's table and queues, as the real stack's do."""
    template = {
        "Resources": {"Marker": {"Type": "AWS::SQS::Queue"}},
        "Outputs": {
            "StateTableName": {"Value": TABLE_NAME},
            "PoolQueueUrlPrefix": {"Value": pool_queue_url_prefix},
            "ResourceClasses": {"Value": json.dumps(sorted(config.resource_classes))},
            "RootVolumeGib": {"Value": str(config.instances.root_volume_gib)},
        },
    }
    boto3.client("cloudformation", region_name=REGION).create_stack(
        StackName=STACK, TemplateBody=json.dumps(template)
    )
    return STACK


def moto_client(service: str, _region: str | None) -> Any:
    """A plain boto3 client in REGION, for the CLI to call moto with: it asks for services by name."""
    return boto3.client(service, region_name=REGION)  # type: ignore[call-overload]  # boto3-stubs take only literal names


def printed(*argv: str, clock: ManualClock) -> tuple[int, str]:
    """The CLI's exit code and what it printed, run against the stack `STACK` on moto."""
    out = io.StringIO()
    code = main(
        ["--stack", STACK, *argv],
        clients=moto_client,
        clock=clock,
        out=out,
    )
    return code, out.getvalue()


def run(*argv: str, clock: ManualClock) -> tuple[int, list[list[str]]]:
    """The CLI's exit code and its output's rows, each split into cells."""
    code, out = printed(*argv, clock=clock)
    rows = [line.split() for line in out.splitlines() if line and not line.startswith("-")]
    return code, rows


def idle(table: StateTable, number: int, **shape: Any) -> str:
    facts = builders.facts(number, **shape)
    table.create(facts, None)
    table.admit(facts.instance_id)
    return facts.instance_id


def running(table: StateTable, number: int) -> str:
    facts = builders.facts(number)
    table.create(facts, builders.run_key(number))
    table.activate(facts.instance_id, builders.run_key(number), 60)
    return facts.instance_id


def test_status_counts_instances_per_class_and_state(
    stack: str, state_table: StateTable, clock: ManualClock, sqs: Any, pool_queue_url_prefix: str
) -> None:
    # Given two idle large instances (one of them pooled), one running large and one idle xlarge
    idle(state_table, 1)
    idle(state_table, 2)
    running(state_table, 3)
    idle(state_table, 4, resource_class="xlarge", cpu=4, memory_mib=8192)
    sqs.send_message(
        QueueUrl=LARGE.queue_name(pool_queue_url_prefix), MessageBody=builders.pool_message(1).to_body()
    )

    # When the operator asks for the status
    code, rows = run("status", clock=clock)

    # Then each class shows its counts per state, and how many wait in its pool queues
    assert code == 0
    assert rows[0][:7] == ["class", "created", "claimed", "running", "idle", "overdue", "pooled"]
    by_class = {row[0]: row[1:7] for row in rows[1:]}
    assert by_class["large"] == ["0", "0", "1", "2", "0", "1"]
    assert by_class["xlarge"] == ["0", "0", "0", "1", "0", "0"]


def test_status_shows_hot_and_stopped_counts_and_the_idle_cost_per_hour(
    stack: str, state_table: StateTable, clock: ManualClock
) -> None:
    # Given two idle c7i.large, one running c7i.large (billed, but not idle) and an idle m7i.xlarge
    idle(state_table, 1)
    idle(state_table, 2)
    running(state_table, 3)
    idle(state_table, 4, resource_class="xlarge", cpu=4, memory_mib=8192, instance_type="m7i.xlarge")

    # When the operator asks for the status
    code, rows = run("status", clock=clock)

    # Then each class shows its hot (idle, still offered) count, no stopped instance (none was stopped),
    # and its idle instances' hourly on-demand list price, c7i.large $0.08925 and m7i.xlarge $0.2016
    # (aws.amazon.com/ec2/pricing/on-demand, us-east-1, Linux), each with its root volume
    assert code == 0
    assert rows[0][7:] == ["hot", "stopped", "idle_usd_per_hour"]
    extra = {row[0]: row[7:] for row in rows[1:]}
    assert extra["large"] == ["2", "0", usd(2 * (0.08925 + VOLUME))]
    assert extra["xlarge"] == ["1", "0", usd(0.2016 + VOLUME)]
    assert extra["2xlarge"] == ["0", "0", "0"]


def test_status_prices_a_stopped_instance_at_its_volume_alone(
    stack: str, state_table: StateTable, clock: ManualClock
) -> None:
    # Given a stopped on-demand c7i.large of the stopped tier
    facts = builders.facts(1, usage_class=UsageClass.ON_DEMAND)
    state_table.create(facts, None)
    state_table.admit(facts.instance_id)
    state_table.stop(facts.instance_id)
    state_table.mark_stopped(facts, clock.now() + 3600)

    # When the operator asks for the status
    code, rows = run("status", clock=clock)

    # Then it counts as stopped, not hot, and costs its volume alone: EC2 bills no usage while stopped
    extra = {row[0]: row[7:] for row in rows[1:]}
    assert code == 0
    assert extra["large"] == ["0", "1", usd(VOLUME)]


def test_status_from_a_stack_without_the_volume_output_marks_the_volumes_unpriced(
    stack: str, state_table: StateTable, clock: ManualClock
) -> None:
    # Given a stack deployed before it said its volumes' size, with one idle c7i.large
    cloudformation = boto3.client("cloudformation", region_name=REGION)
    template = dict(cloudformation.get_template(StackName=STACK)["TemplateBody"])
    template["Outputs"] = {k: v for k, v in template["Outputs"].items() if k != "RootVolumeGib"}
    cloudformation.create_stack(StackName="Older", TemplateBody=json.dumps(template))
    idle(state_table, 1)

    # When the operator asks for its status
    out = io.StringIO()
    code = main(
        ["--stack", "Older", "status"],
        clients=moto_client,
        clock=clock,
        out=out,
    )

    # Then the instance's price counts and its volume is marked unknown, never priced as zero
    rows = [line.split() for line in out.getvalue().splitlines() if line and not line.startswith("-")]
    assert code == 0
    assert {row[0]: row[7:] for row in rows[1:]}["large"] == ["1", "0", "0.08925+?"]


def test_status_counts_an_overdue_idle_instance_in_the_cost_but_not_as_hot(
    stack: str, state_table: StateTable, clock: ManualClock
) -> None:
    # Given an idle instance whose idle time has passed (refresh has not terminated it yet: it still bills)
    idle(state_table, 1)
    clock.advance(Timeouts().idle_seconds + 1)

    # When the operator asks for the status
    code, rows = run("status", clock=clock)

    # Then it is overdue, not hot, and its price still counts
    extra = {row[0]: row[7:] for row in rows[1:]}
    assert code == 0
    assert extra["large"] == ["0", "0", usd(0.08925 + VOLUME)]


def test_status_lists_the_jobs_waiting_for_capacity_with_ec2s_reason(
    stack: str, state_table: StateTable, clock: ManualClock, dynamodb: Any
) -> None:
    # Given two jobs of a run whose provision EC2 left short, a minute and a half ago
    CapacityWaits(TABLE_NAME, clock, dynamodb).note(
        Shortfall(
            execution="provision-a",
            repository="octo/app",
            run_key="pool=7/class=large",
            resource_class="large",
            usage="spot",
            jobs=2,
            reason="InsufficientInstanceCapacity (4 pools)",
        )
    )
    clock.advance(90)

    # When the operator asks for the status
    code, rows = run("status", clock=clock)

    # Then below the classes, the wait is listed: class, usage, jobs, EC2's reason, how long, when next
    assert code == 0
    at = rows.index(["jobs", "waiting", "for", "capacity"])
    assert rows[at + 1][:4] == ["class", "usage", "jobs", "reason"]
    assert rows[at + 2] == [
        "large", "spot", "2", "InsufficientInstanceCapacity", "(4", "pools)", "1m30s", "1", "due",
        "octo/app", "pool=7/class=large",
    ]  # fmt: skip


def test_status_says_it_does_not_know_the_price_of_a_type_missing_from_its_table(
    stack: str, state_table: StateTable, clock: ManualClock
) -> None:
    # Given an idle instance of a type the price table lacks, beside one it knows
    idle(state_table, 1)
    idle(state_table, 2, instance_type="x9z.large")
    idle(state_table, 3, resource_class="xlarge", cpu=4, memory_mib=8192, instance_type="x9z.xlarge")

    # When the operator asks for the status
    code, rows = run("status", clock=clock)

    # Then the known part (the known type, every volume) is summed and the unknown one is marked, never
    # priced as zero
    extra = {row[0]: row[7:] for row in rows[1:]}
    assert code == 0
    assert extra["large"][2] == usd(0.08925 + 2 * VOLUME) + "+?"
    assert extra["xlarge"][2] == usd(VOLUME) + "+?"


def test_instances_lists_every_live_instance_with_its_holder(
    stack: str, state_table: StateTable, clock: ManualClock
) -> None:
    # Given an idle instance, a running one, and one that was terminated
    idle(state_table, 1)
    running(state_table, 2)
    gone = idle(state_table, 3)
    state_table.expire(gone, None)
    state_table.mark_terminated(gone)

    # When the operator lists instances
    code, rows = run("instances", clock=clock)

    # Then the live two are listed with state, class and run key; the terminated one is not
    assert code == 0
    listed = {row[0]: row for row in rows[1:]}
    assert set(listed) == {builders.facts(1).instance_id, builders.facts(2).instance_id}
    assert listed[builders.facts(2).instance_id][1:3] == ["running", "large"]
    assert listed[builders.facts(2).instance_id][-1] == builders.run_key(2)


def test_pool_shows_each_partitions_queue_and_its_idle_records(  # noqa: PLR0917 - pytest fixtures
    stack: str,
    state_table: StateTable,
    clock: ManualClock,
    sqs: Any,
    pool_queue_url_prefix: str,
    config: StackConfig,
) -> None:
    # Given one idle large spot x64 instance whose message waits in its partition's queue, and an idle
    # large on-demand arm64 one not pooled yet
    idle(state_table, 1)
    idle(state_table, 2, usage_class=UsageClass.ON_DEMAND, arch=Arch.ARM64, instance_type="c7g.large")
    sqs.send_message(
        QueueUrl=LARGE.queue_name(pool_queue_url_prefix), MessageBody=builders.pool_message(1).to_body()
    )

    # When the operator looks at the pool
    code, rows = run("pool", clock=clock)

    # Then every partition has its row; the spot x64 queue has one message ready and one idle record
    # behind it, the on-demand arm64 queue none for its one idle record
    assert code == 0
    assert rows[0][:3] == ["class", "usage", "arch"]
    by_partition = {tuple(row[:3]): row[3:] for row in rows[1:]}
    assert by_partition[("large", "spot", "x64")] == ["1", "0", "0", "1"]
    assert by_partition[("large", "on-demand", "arm64")] == ["0", "0", "0", "1"]
    assert len(by_partition) == len(config.resource_classes) * 4


def test_drain_expires_the_idle_instances_of_one_class_only(
    stack: str, state_table: StateTable, clock: ManualClock
) -> None:
    # Given idle and running large instances and an idle xlarge one
    drained = [idle(state_table, 1), idle(state_table, 2)]
    busy = running(state_table, 3)
    other = idle(state_table, 4, resource_class="xlarge", cpu=4, memory_mib=8192)

    # When the operator drains class large
    code, rows = run("drain", "large", clock=clock)

    # Then the idle large instances are expired: due for refresh to terminate, their state kept
    assert code == 0
    assert {row[0] for row in rows[1:-1] if row[1:] == ["expired"]} == set(drained)
    due = {record.instance_id for record in state_table.due()}
    assert due == set(drained)
    # And the running instance and the other class are untouched
    assert state_table.get(busy).state is InstanceState.RUNNING  # type: ignore[union-attr]
    assert other not in due


def test_drain_of_a_class_the_stack_does_not_have_fails(stack: str, clock: ManualClock) -> None:
    # Given a class name the stack has no queue for / When drained / Then the CLI says so and fails
    code, _rows = run("drain", "huge", clock=clock)
    assert code == 2


def test_a_missing_stack_fails_with_its_name(
    aws: None, clock: ManualClock, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given no stack of that name / When the CLI runs / Then it fails naming the stack
    code, _rows = run("status", clock=clock)
    assert code == 1
    assert f"stack {STACK!r}" in capsys.readouterr().err
