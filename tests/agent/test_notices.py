"""Issue 15, item 4: the agent hears of its claim by a notice, long before its watch period, from its own
queue only; a queue that is missing or a notice that is lost costs time, never the claim.

The control plane's side is the adapter the Lambdas use (runner_pool.adapters.notice_queues); the agent's
calls are checked against the synthesized instance role, whose receive condition is the queue's
`runner-pool:instance` tag (SQS Developer Guide, "ABAC condition keys for Amazon SQS").
"""

from __future__ import annotations

import time
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from agent.imds import InstanceIdentity
from emulator.aws import ACCOUNT
from emulator.harness.control_plane import REGION
from runner_pool.adapters.notice_queues import NoticeQueues
from runner_pool.domain import notices
from runner_pool.domain.records import Signal
from tests.agent.conftest import (
    AgentFactory,
    ControlPlane,
    RunningAgent,
    eventually,
    idle_agent,
    jit_config,
)

RUN = "pool=778/class=large"
PREFIX = f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{notices.queue_name_prefix('RunnerPool')}"
SLOW_WATCH = 30.0
"""A watch period no test waits out: whatever the agent does sooner, a notice made it do."""


@pytest.fixture
def queues(aws: None, identity: InstanceIdentity) -> NoticeQueues:
    return NoticeQueues(
        PREFIX,
        boto3.client("sqs", region_name=REGION),
        stack_tag=("runner-pool:stack", "RunnerPool"),
        arns=identity.arns,
    )


def claimed_and_handed_over(
    control_plane: ControlPlane, config: str | None = None, runner_id: int = 21
) -> None:
    control_plane.claim(RUN, config=None)
    assert control_plane.records.record_runner(control_plane.instance_id, RUN, 21).succeeded
    control_plane.credentials.store(
        control_plane.instance_id,
        control_plane.identity.arn,
        RUN,
        config or jit_config(),
        runner_id=runner_id,
    )


def reads_of(dynamodb: Any) -> list[tuple[str, tuple[str, ...]]]:
    """From now on, each read the client makes: its operation and the sort keys of the items it names."""
    reads: list[tuple[str, tuple[str, ...]]] = []

    def note(params: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name == "GetItem":
            reads.append((model.name, (params["Key"]["sk"]["S"],)))
        elif model.name == "BatchGetItem":
            keys = [key for request in params["RequestItems"].values() for key in request["Keys"]]
            reads.append((model.name, tuple(key["sk"]["S"] for key in keys)))

    dynamodb.meta.events.register("provide-client-params.dynamodb.*", note)
    return reads


def listening_agent(
    control_plane: ControlPlane, agents: AgentFactory, queues: NoticeQueues
) -> tuple[RunningAgent, list[tuple[str, tuple[str, ...]]]]:
    """An idle pooled instance whose agent reads its record only every 30 s, its notice queue open, once
    its first look is done; and the reads its agent makes from then on."""
    control_plane.launch_for_pool()
    assert queues.open([control_plane.instance_id]) == []
    running = agents.build(
        notice_queue_url_prefix=PREFIX, notice_wait_seconds=1, watch_period_seconds=SLOW_WATCH
    )
    reads = reads_of(running.dynamodb)
    agents.started.append(running.start())
    control_plane.await_signal(Signal.UD_OK, None)
    eventually(lambda: bool(reads), what="the agent's first look at its record")
    reads.clear()
    return running, reads


def test_a_notice_wakes_the_agent_long_before_its_watch_period(
    control_plane: ControlPlane, agents: AgentFactory, queues: NoticeQueues
) -> None:
    # Given an idle pooled instance whose agent reads its record only every 30 s, with its notice queue open
    running, _ = listening_agent(control_plane, agents, queues)
    # When it is claimed and handed its config, and nothing is sent for a whole long poll of its queue
    claimed_and_handed_over(control_plane)
    running.listened_again()
    # Then the agent has not seen it (the test can fail: without a notice the claim waits for the watch)
    assert control_plane.latest_signal() is Signal.UD_OK
    # And when the notice is sent, the runner listens within seconds, not the watch period
    sent = time.monotonic()
    assert queues.notify(control_plane.instance_id) is None
    control_plane.await_signal(Signal.UD_REG_OK, RUN, timeout=5.0)
    assert time.monotonic() - sent < SLOW_WATCH / 3
    # And the notice was taken off the queue
    attributes = boto3.client("sqs", region_name=REGION).get_queue_attributes(
        QueueUrl=queues.url(control_plane.instance_id), AttributeNames=["ApproximateNumberOfMessages"]
    )
    assert attributes["Attributes"]["ApproximateNumberOfMessages"] == "0"


def test_a_notice_is_answered_with_one_read_of_the_record_and_its_config(
    control_plane: ControlPlane, agents: AgentFactory, queues: NoticeQueues
) -> None:
    # Given an idle pooled instance whose agent reads its record only every 30 s, claimed and handed over
    _, reads = listening_agent(control_plane, agents, queues)
    claimed_and_handed_over(control_plane)
    # When the notice is sent
    assert queues.notify(control_plane.instance_id) is None
    control_plane.await_signal(Signal.UD_REG_OK, RUN, timeout=5.0)
    # Then the agent read its record and its config in one consistent BatchGetItem, and nothing else
    # (every GetItem or BatchGetItem is a round trip between the notice and the runner's start)
    assert reads == [("BatchGetItem", ("state", "runner-config"))]


def test_the_periodic_look_reads_the_record_alone(control_plane: ControlPlane, agents: AgentFactory) -> None:
    # Given an idle pooled instance whose agent has no notice queue and looks every 50 ms
    running = idle_agent(control_plane, agents)
    # When it looks several times without a notice
    reads = reads_of(running.dynamodb)
    eventually(lambda: len(reads) >= 5, what="five looks")
    # Then each look is one GetItem of its record: an idle agent never reads its config (its idle cost)
    assert set(reads) == {("GetItem", ("state",))}


def test_a_notice_with_a_config_of_another_runner_waits_for_the_one_the_record_names(
    control_plane: ControlPlane, agents: AgentFactory, queues: NoticeQueues
) -> None:
    # Given an idle agent that reads its record only every 30 s, and a record naming runner 21 while the
    # config stored is runner 20's (a registration the control plane replaced)
    running, reads = listening_agent(control_plane, agents, queues)
    claimed_and_handed_over(control_plane, runner_id=20)
    # When a notice is sent / Then the agent reads both and starts no runner from that config (the last
    # check below proves it: the one runner started is runner 21's)
    assert queues.notify(control_plane.instance_id) is None
    eventually(lambda: ("BatchGetItem", ("state", "runner-config")) in reads, what="the notice's look")
    assert running.runner_starts == []
    # And when runner 21's config is stored and noticed / Then the agent starts it
    config = jit_config()
    control_plane.credentials.store(
        control_plane.instance_id, control_plane.identity.arn, RUN, config, runner_id=21
    )
    assert queues.notify(control_plane.instance_id) is None
    control_plane.await_runner(running, RUN, config, timeout=5.0)


def test_an_agent_without_a_queue_still_serves_its_claim_at_its_watch_period(
    control_plane: ControlPlane, agents: AgentFactory
) -> None:
    # Given an agent told of notice queues whose own queue was never opened (refresh would open it later)
    idle_agent(
        control_plane, agents, notice_queue_url_prefix=PREFIX, notice_wait_seconds=1, watch_period_seconds=0.2
    )
    # When it is claimed and handed over / Then it reads its record and serves, its listener retrying aside
    claimed_and_handed_over(control_plane)
    control_plane.await_signal(Signal.UD_REG_OK, RUN)


def test_an_instance_cannot_receive_another_instances_notices(
    control_plane: ControlPlane, agents: AgentFactory, queues: NoticeQueues
) -> None:
    # Given another instance's notice queue, tagged with that instance's ARN
    other = "i-0fedcba9876543210"
    assert queues.open([other]) == []
    queues.notify(other)
    running = agents.build(notice_queue_url_prefix=PREFIX)
    check = agents.policy_check
    assert check is not None
    sqs = boto3.client("sqs", region_name=REGION)
    check.on_client(sqs, check.iam.instance(control_plane.instance_id))
    # When this instance's credentials receive from it / Then the instance role denies it
    with pytest.raises(ClientError) as denied:
        sqs.receive_message(QueueUrl=queues.url(other), WaitTimeSeconds=0)
    assert denied.value.response["Error"]["Code"] == "AccessDenied"
    check.excuse("sqs:ReceiveMessage", "this test asks for the denial")
    # And its own queue is allowed
    assert queues.open([control_plane.instance_id]) == []
    sqs.receive_message(QueueUrl=queues.url(control_plane.instance_id), WaitTimeSeconds=0)
    assert running.settings.notice_queue_url_prefix == PREFIX
