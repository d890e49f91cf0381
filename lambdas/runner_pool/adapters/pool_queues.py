"""The pool queues over SQS: one standard queue per pool partition, one message per idle instance.

A partition's queue URL is the stack's URL prefix followed by the partition's name
(PoolPartition.queue_name): the functions are told the prefix, not one URL per queue, because a
Lambda function's environment holds 4 KB in all (Lambda quotas, "Function configuration, deployment,
and execution") and a stack has a queue for every class, usage and architecture.

Batch calls (DeleteMessageBatch, ChangeMessageVisibilityBatch, SendMessageBatch) can succeed for some
entries and fail for others; the failed entries are retried once. What fails twice is handed back to
the caller, never dropped quietly and never raised for the whole batch:

- A message that cannot be deleted stays in the queue and comes round again when its hold ends: a
  harmless duplicate, since every use of a message goes through a record check and a conditional
  claim, and pickup drops the copy whose record has moved on.
- A message that cannot be released stays hidden until its hold ends, then comes round again.
- A message that cannot be sent is not in that queue; pickup, which sends only to move an offer to
  its own partition, keeps it where it was.

Errors of a whole call (a missing queue, denied access, throttling past every retry) propagate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from runner_pool.adapters import aws_clients
from runner_pool.adapters.aws_clients import ServiceBusyError
from runner_pool.domain.pickup import RECEIVE_BATCH, ReceivedMessage
from runner_pool.domain.pool_partitions import PoolPartition
from runner_pool.domain.records import PoolMessage

if TYPE_CHECKING:
    from mypy_boto3_sqs.client import SQSClient
    from mypy_boto3_sqs.type_defs import (
        ChangeMessageVisibilityBatchRequestEntryTypeDef,
        DeleteMessageBatchRequestEntryTypeDef,
        SendMessageBatchRequestEntryTypeDef,
    )

_Item = TypeVar("_Item")
_Entry = TypeVar("_Entry")

DEFAULT_WAIT_SECONDS = 1
"""Long-poll wait of each ReceiveMessage in production; see PoolQueues.receive for why."""


class NoPoolQueueError(LookupError):
    """A partition that has no pool queue: the stack config and the deployed queues disagree."""

    def __init__(self, partition: PoolPartition, classes: Iterable[str]) -> None:
        super().__init__(
            f"no pool queue for {partition.name!r}: resource class {partition.resource_class!r} is not "
            f"one of the stack's; its classes are: {', '.join(sorted(classes)) or 'none at all'}"
        )
        self.partition = partition


class PoolQueues:
    def __init__(
        self,
        url_prefix: str,
        resource_classes: Iterable[str],
        client: SQSClient | None = None,
        wait_seconds: int = DEFAULT_WAIT_SECONDS,
    ) -> None:
        """`url_prefix`: every pool queue's URL up to its partition's name; `resource_classes`: the
        stack's, which have a queue for each usage and architecture."""
        self._url_prefix = url_prefix
        self._classes = frozenset(resource_classes)
        self._client: SQSClient = client or aws_clients.client("sqs")
        self._wait_seconds = wait_seconds

    @property
    def partitions(self) -> tuple[PoolPartition, ...]:
        """Every partition that has a queue."""
        return PoolPartition.every(sorted(self._classes))

    def receive(self, partition: PoolPartition, hold_seconds: int) -> list[ReceivedMessage]:
        url = self._url(partition)
        # Short polling asks only a sample of SQS's servers, so a queue holding a few messages can
        # answer empty, and an empty answer makes pickup give up and launch a new instance. A long
        # poll asks every server and returns as soon as one message is there; it only costs its
        # wait when the queue really is empty, where the caller is about to launch anyway.
        response = self._client.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=RECEIVE_BATCH,
            WaitTimeSeconds=self._wait_seconds,
            VisibilityTimeout=hold_seconds,
        )
        return [
            ReceivedMessage(receipt=message["ReceiptHandle"], message=_parse(message.get("Body", "")))
            for message in response.get("Messages", [])
        ]

    def delete(self, partition: PoolPartition, receipts: Sequence[str]) -> list[str]:
        url = self._url(partition)

        def entry(entry_id: str, receipt: str) -> DeleteMessageBatchRequestEntryTypeDef:
            return {"Id": entry_id, "ReceiptHandle": receipt}

        def delete_chunk(entries: list[DeleteMessageBatchRequestEntryTypeDef]) -> list[str]:
            response = self._client.delete_message_batch(QueueUrl=url, Entries=entries)
            return [failed["Id"] for failed in response.get("Failed", [])]

        return _in_batches(receipts, entry, delete_chunk)

    def release(self, partition: PoolPartition, receipts: Sequence[str], delay_seconds: int) -> list[str]:
        url = self._url(partition)

        def entry(entry_id: str, receipt: str) -> ChangeMessageVisibilityBatchRequestEntryTypeDef:
            return {"Id": entry_id, "ReceiptHandle": receipt, "VisibilityTimeout": delay_seconds}

        def release_chunk(entries: list[ChangeMessageVisibilityBatchRequestEntryTypeDef]) -> list[str]:
            response = self._client.change_message_visibility_batch(QueueUrl=url, Entries=entries)
            return [failed["Id"] for failed in response.get("Failed", [])]

        return _in_batches(receipts, entry, release_chunk)

    def requeue(
        self, partition: PoolPartition, messages: Sequence[PoolMessage], delay_seconds: int
    ) -> list[PoolMessage]:
        url = self._url(partition)

        def entry(entry_id: str, message: PoolMessage) -> SendMessageBatchRequestEntryTypeDef:
            return {"Id": entry_id, "MessageBody": message.to_body(), "DelaySeconds": delay_seconds}

        def send_chunk(entries: list[SendMessageBatchRequestEntryTypeDef]) -> list[str]:
            response = self._client.send_message_batch(QueueUrl=url, Entries=entries)
            return [failed["Id"] for failed in response.get("Failed", [])]

        return _in_batches(messages, entry, send_chunk)

    def offer(self, message: PoolMessage) -> None:
        url = self._url(PoolPartition.of(message))
        self._client.send_message(QueueUrl=url, MessageBody=message.to_body())

    def waiting(self, partition: PoolPartition) -> int:
        attributes = self._client.get_queue_attributes(
            QueueUrl=self._url(partition), AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        return int(attributes.get("ApproximateNumberOfMessages", "0"))

    def _url(self, partition: PoolPartition) -> str:
        if partition.resource_class not in self._classes:
            raise NoPoolQueueError(partition, self._classes)
        return partition.queue_name(self._url_prefix)


def _in_batches(
    items: Sequence[_Item],
    entry: Callable[[str, _Item], _Entry],
    call: Callable[[list[_Entry]], list[str]],
) -> list[_Item]:
    """Run a batch call over `items` in chunks of 10, retry failed entries once, return what failed twice.

    A call that raises (AWS busy through every retry, or its answer lost after it took effect) fails
    each of its entries: the caller treats them as not done, which for every batch call here is safe to
    be wrong about (a message not deleted or not released comes back when its hold ends; one sent twice
    is a duplicate pickup drops on its record). So a lost answer never loses an offer."""
    refused: list[_Item] = []
    for start in range(0, len(items), RECEIVE_BATCH):
        pending = {str(index): item for index, item in enumerate(items[start : start + RECEIVE_BATCH])}
        for _attempt in range(2):
            entries = [entry(entry_id, item) for entry_id, item in pending.items()]
            try:
                failed_ids = set(call(entries))
            except (ClientError, BotoCoreError, ServiceBusyError, aws_clients.ServiceUnreachableError):
                failed_ids = set(pending)
            pending = {entry_id: item for entry_id, item in pending.items() if entry_id in failed_ids}
            if not pending:
                break
        refused.extend(pending.values())
    return refused


def _parse(body: str) -> PoolMessage | None:
    """A body that is not a pool message is returned as None, for pickup to drop and count."""
    try:
        return PoolMessage.from_body(body)
    except ValueError:
        return None
