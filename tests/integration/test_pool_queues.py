"""The pool queues adapter against moto's SQS: batch sizes, partial failures, throttling, bad input."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, cast

import pytest

from runner_pool.adapters.aws_clients import ATTEMPTS, ServiceBusyError
from runner_pool.adapters.pool_queues import NoPoolQueueError, PoolQueues
from runner_pool.domain.config import DEFAULT_RESOURCE_CLASSES
from runner_pool.domain.pool_partitions import PoolPartition
from runner_pool.domain.records import Arch, PoolMessage, UsageClass
from tests.support.aws_faults import answer_busy
from tests.support.builders import pool_message

if TYPE_CHECKING:
    from mypy_boto3_sqs.client import SQSClient

CLASSES = tuple(DEFAULT_RESOURCE_CLASSES)
LARGE = PoolPartition("large", UsageClass.SPOT, Arch.X64)
"""The partition of builders.pool_message's instance: a spot c7i.large."""
HUGE = PoolPartition("huge", UsageClass.SPOT, Arch.X64)


@pytest.fixture
def queues(sqs: Any, pool_queue_url_prefix: str) -> PoolQueues:
    return PoolQueues(pool_queue_url_prefix, CLASSES, sqs, wait_seconds=0)


class _RefusingBatches:
    """The SQS client, except that each batch call refuses its last entry, `refusals` times in all.

    Refused entries are not passed on to SQS and come back under `Failed`, as SQS reports a partial
    failure; every other entry really reaches the queue.
    """

    def __init__(self, client: Any, refusals: int) -> None:
        self._client = client
        self._refusals = refusals
        self.batches: list[list[str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def as_sqs(self) -> SQSClient:
        """This stand-in, where PoolQueues takes the SQS client it stands in for."""
        return cast("SQSClient", self)

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:  # noqa: N803
        return self._batch(self._client.send_message_batch, QueueUrl, Entries)

    def delete_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:  # noqa: N803
        return self._batch(self._client.delete_message_batch, QueueUrl, Entries)

    def _batch(self, call: Any, url: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
        self.batches.append([entry["Id"] for entry in entries])
        refused = entries[-1:] if self._refusals > 0 else []
        self._refusals -= len(refused)
        passed = [entry for entry in entries if entry not in refused]
        response = call(QueueUrl=url, Entries=passed) if passed else {}
        failed = [{"Id": e["Id"], "SenderFault": False, "Code": "InternalError"} for e in refused]
        return {"Successful": response.get("Successful", []), "Failed": failed}


def messages(count: int) -> list[PoolMessage]:
    return [pool_message(number) for number in range(1, count + 1)]


def received(queues: PoolQueues, count: int, hold_seconds: int) -> list[str]:
    """`count` (at most 30) messages offered, then received and held: their receipts."""
    queues.requeue(LARGE, messages(count), delay_seconds=0)
    return [r.receipt for _ in range(3) for r in queues.receive(LARGE, hold_seconds)]


def depth(sqs: Any, url: str) -> dict[str, int]:
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return {
        "visible": int(attributes["ApproximateNumberOfMessages"]),
        "delayed": int(attributes["ApproximateNumberOfMessagesDelayed"]),
        "in_flight": int(attributes["ApproximateNumberOfMessagesNotVisible"]),
    }


def test_receive_asks_for_ten_with_the_configured_wait(
    sqs: Any, pool_queue_url_prefix: str, sqs_calls: list[tuple[str, dict[str, Any]]]
) -> None:
    # Given pool queues configured with a one-second long poll, and twelve messages queued
    queues = PoolQueues(pool_queue_url_prefix, CLASSES, sqs, wait_seconds=1)
    queues.requeue(LARGE, messages(12), delay_seconds=0)
    sqs_calls.clear()
    # When one receive is made, holding what it gets for 30 s
    received = queues.receive(LARGE, 30)
    # Then it asked SQS for the maximum of ten, waiting up to one second, hidden for 30 s, and got ten
    assert sqs_calls == [
        (
            "ReceiveMessage",
            {
                "QueueUrl": LARGE.queue_name(pool_queue_url_prefix),
                "MaxNumberOfMessages": 10,
                "WaitTimeSeconds": 1,
                "VisibilityTimeout": 30,
            },
        )
    ]
    assert len(received) == 10


def test_the_production_default_is_a_short_long_poll(sqs: Any, pool_queue_url_prefix: str) -> None:
    # Given pool queues built without a wait
    queues = PoolQueues(pool_queue_url_prefix, CLASSES, sqs)
    calls: list[dict[str, Any]] = []
    sqs.meta.events.register(
        "provide-client-params.sqs.ReceiveMessage", lambda params, **_: calls.append(dict(params))
    )
    queues.requeue(LARGE, messages(1), delay_seconds=0)
    # When they receive
    queues.receive(LARGE, 0)
    # Then they long-poll for one second, so a small queue is not mistaken for an empty one
    assert calls[0]["WaitTimeSeconds"] == 1


def test_a_received_body_is_parsed_into_a_pool_message(queues: PoolQueues) -> None:
    # Given an offered instance
    offered = pool_message(1)
    queues.offer(offered)
    # When the queue is received from
    (received,) = queues.receive(LARGE, 0)
    # Then the message is the one offered, threshold and all, with a receipt to delete it by
    assert received.message == offered
    assert received.receipt


def test_a_body_that_is_not_a_pool_message_is_received_as_none(
    sqs: Any, pool_queue_url_prefix: str, queues: PoolQueues
) -> None:
    # Given a body of the right JSON shape but missing fields
    sqs.send_message(QueueUrl=LARGE.queue_name(pool_queue_url_prefix), MessageBody='{"instance_id": "i-1"}')
    # When the queue is received from
    (received,) = queues.receive(LARGE, 0)
    # Then it comes with its receipt, and no message, for pickup to drop and count
    assert received.message is None
    assert received.receipt


@pytest.mark.parametrize(
    "instance_id", ["i-" + "0" * 2000, "i-0123456789abcdeFF", "i-12345", "../i-0123abcd"]
)
def test_a_message_whose_instance_id_is_not_an_ec2_id_is_received_as_none(
    sqs: Any, pool_queue_url_prefix: str, queues: PoolQueues, instance_id: str
) -> None:
    # Given a forged message, well-formed but for its instance id (issue 12, defect 10: an over-long id
    # reached DynamoDB's key limit in every provision that read it, and was put back each time)
    body = json.loads(pool_message(1).model_dump_json()) | {"instance_id": instance_id}
    sqs.send_message(QueueUrl=LARGE.queue_name(pool_queue_url_prefix), MessageBody=json.dumps(body))
    # When the queue is received from
    (received,) = queues.receive(LARGE, 0)
    # Then it is no pool message: pickup drops and counts it
    assert received.message is None


def test_offer_goes_to_the_queue_of_the_instances_own_partition(
    sqs: Any, pool_queue_url_prefix: str, queues: PoolQueues
) -> None:
    # Given an idle xlarge on-demand arm64 instance
    offered = pool_message(
        1, resource_class="xlarge", cpu=4, memory_mib=8192, usage_class=UsageClass.ON_DEMAND, arch=Arch.ARM64
    )
    # When it is offered
    queues.offer(offered)
    # Then it sits in the queue of exactly its class, usage and architecture, and in no other
    own = PoolPartition("xlarge", UsageClass.ON_DEMAND, Arch.ARM64)
    assert [r.message for r in queues.receive(own, 0)] == [offered]
    others = [p for p in queues.partitions if p != own]
    assert len(others) == len(CLASSES) * 4 - 1
    assert all(depth(sqs, p.queue_name(pool_queue_url_prefix))["visible"] == 0 for p in others)


def test_requeue_sends_in_batches_of_ten_with_the_delay(
    sqs: Any,
    pool_queue_url_prefix: str,
    queues: PoolQueues,
    sqs_calls: list[tuple[str, dict[str, Any]]],
) -> None:
    # Given 25 messages to send back
    # When they are requeued with a delay
    refused = queues.requeue(LARGE, messages(25), delay_seconds=30)
    # Then three batch calls of 10, 10 and 5 sent them all, each held back by the delay
    assert refused == []
    assert [(name, len(p["Entries"])) for name, p in sqs_calls] == [
        ("SendMessageBatch", n) for n in (10, 10, 5)
    ]
    assert {entry["DelaySeconds"] for _, p in sqs_calls for entry in p["Entries"]} == {30}
    assert depth(sqs, LARGE.queue_name(pool_queue_url_prefix)) == {
        "visible": 0,
        "delayed": 25,
        "in_flight": 0,
    }


def test_delete_removes_received_messages_in_batches_of_ten(
    sqs: Any,
    pool_queue_url_prefix: str,
    queues: PoolQueues,
    sqs_calls: list[tuple[str, dict[str, Any]]],
) -> None:
    # Given 25 messages received
    receipts = received(queues, 25, hold_seconds=30)
    sqs_calls.clear()
    # When they are deleted
    undeleted = queues.delete(LARGE, receipts)
    # Then three batch calls removed them all from the queue
    assert len(receipts) == 25
    assert undeleted == []
    assert [name for name, _ in sqs_calls] == ["DeleteMessageBatch"] * 3
    assert depth(sqs, LARGE.queue_name(pool_queue_url_prefix)) == {"visible": 0, "delayed": 0, "in_flight": 0}


def test_release_makes_held_messages_visible_after_the_delay_in_batches_of_ten(
    sqs: Any,
    pool_queue_url_prefix: str,
    queues: PoolQueues,
    sqs_calls: list[tuple[str, dict[str, Any]]],
) -> None:
    # Given 25 messages received and held for 30 s
    receipts = received(queues, 25, hold_seconds=30)
    url = LARGE.queue_name(pool_queue_url_prefix)
    assert depth(sqs, url)["in_flight"] == 25
    sqs_calls.clear()
    # When the first ten are released at once and the others with a delay
    refused = queues.release(LARGE, receipts[:10], 0) + queues.release(LARGE, receipts[10:], 60)
    # Then three batch calls released them all: ten visible now, fifteen still hidden for the delay
    assert refused == []
    assert [(name, len(p["Entries"])) for name, p in sqs_calls] == [
        ("ChangeMessageVisibilityBatch", n) for n in (10, 10, 5)
    ]
    assert depth(sqs, url) == {"visible": 10, "delayed": 0, "in_flight": 15}


def test_a_requeue_entry_that_fails_once_is_retried_alone(sqs: Any, pool_queue_url_prefix: str) -> None:
    # Given SQS that fails one entry of the first batch call
    client = _RefusingBatches(sqs, refusals=1)
    queues = PoolQueues(pool_queue_url_prefix, CLASSES, client.as_sqs(), wait_seconds=0)
    # When three messages are requeued
    refused = queues.requeue(LARGE, messages(3), delay_seconds=0)
    # Then the failed entry was sent again on its own, and all three are in the queue
    assert refused == []
    assert client.batches == [["0", "1", "2"], ["2"]]
    assert depth(sqs, LARGE.queue_name(pool_queue_url_prefix))["visible"] == 3


def test_a_requeue_entry_that_fails_twice_is_reported_not_retried_again(
    sqs: Any, pool_queue_url_prefix: str
) -> None:
    # Given SQS that fails the same entry on the first call and on the retry
    client = _RefusingBatches(sqs, refusals=2)
    queues = PoolQueues(pool_queue_url_prefix, CLASSES, client.as_sqs(), wait_seconds=0)
    sent = messages(3)
    # When three messages are requeued
    refused = queues.requeue(LARGE, sent, delay_seconds=0)
    # Then that message is handed back to the caller after one retry, and the other two are queued
    assert refused == [sent[2]]
    assert len(client.batches) == 2
    assert depth(sqs, LARGE.queue_name(pool_queue_url_prefix))["visible"] == 2


def test_a_receipt_that_cannot_be_deleted_is_reported(
    sqs: Any, pool_queue_url_prefix: str, queues: PoolQueues
) -> None:
    # Given three received messages, and SQS that fails one delete entry twice
    queues.requeue(LARGE, messages(3), delay_seconds=0)
    receipts = [r.receipt for r in queues.receive(LARGE, 30)]
    refusing = PoolQueues(
        pool_queue_url_prefix, CLASSES, _RefusingBatches(sqs, refusals=2).as_sqs(), wait_seconds=0
    )
    # When they are deleted
    undeleted = refusing.delete(LARGE, receipts)
    # Then that receipt is handed back, and its message is still in the queue (in flight)
    assert undeleted == [receipts[2]]
    assert depth(sqs, LARGE.queue_name(pool_queue_url_prefix)) == {"visible": 0, "delayed": 0, "in_flight": 1}


def test_a_throttled_receive_is_retried(sqs: Any, queues: PoolQueues) -> None:
    # Given an offered instance, and SQS throttling the next two receives (RequestThrottled, as SQS does)
    queues.offer(pool_message(1))
    busy = answer_busy(sqs, "ReceiveMessage", times=2, code="RequestThrottled")
    # When the queue is received from
    received = queues.receive(LARGE, 0)
    # Then botocore's third attempt got the message
    assert [r.message for r in received] == [pool_message(1)]
    assert busy.sent == 3


def test_a_throttled_requeue_is_retried(sqs: Any, pool_queue_url_prefix: str, queues: PoolQueues) -> None:
    # Given SQS throttling the next batch send
    answer_busy(sqs, "SendMessageBatch", times=1, code="RequestThrottled")
    # When messages are requeued
    refused = queues.requeue(LARGE, messages(2), delay_seconds=0)
    # Then the retry sent them
    assert refused == []
    assert depth(sqs, LARGE.queue_name(pool_queue_url_prefix))["visible"] == 2


def test_throttling_past_every_retry_reaches_the_caller(sqs: Any, queues: PoolQueues) -> None:
    # Given SQS throttling every receive
    busy = answer_busy(sqs, "ReceiveMessage", times=1000, code="RequestThrottled")
    # When the queue is received from
    # Then the caller is told the service stayed busy, rather than shown an empty queue, after the
    # attempts botocore makes and no more
    with pytest.raises(ServiceBusyError):
        queues.receive(LARGE, 0)
    assert busy.sent == ATTEMPTS


@pytest.mark.parametrize(
    "use",
    [
        lambda q: q.receive(HUGE, 0),
        lambda q: q.delete(HUGE, ["receipt"]),
        lambda q: q.release(HUGE, ["receipt"], 0),
        lambda q: q.requeue(HUGE, messages(1), 0),
        lambda q: q.offer(pool_message(1, resource_class="huge")),
    ],
    ids=["receive", "delete", "release", "requeue", "offer"],
)
def test_a_class_without_a_queue_is_a_clear_error(queues: PoolQueues, use: Any) -> None:
    # Given pool queues for the configured classes only
    # When a class that has no queue is used
    # Then the error names the partition and the classes that do have queues
    with pytest.raises(NoPoolQueueError, match=r"'huge'.*2xlarge, 4xlarge, 8xlarge, large, xlarge"):
        use(queues)
