"""The demand queue over SQS: the webhook sends one message per delivery that asks for something.

The queue is a standard queue: the dispatcher groups, orders and deduplicates what it receives, so it
needs neither FIFO's ordering nor its five-minute deduplication (and a FIFO queue would hand the
dispatcher one message group at a time, defeating the batching of a matrix).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from runner_pool.adapters import aws_clients
from runner_pool.adapters.aws_clients import error_code
from runner_pool.domain.demand import DemandMessage, to_body

if TYPE_CHECKING:
    from mypy_boto3_sqs.client import SQSClient

BATCH_LIMIT = 10
"""SQS takes at most ten entries in one ChangeMessageVisibilityBatch."""


class DemandQueueError(RuntimeError):
    """The message was not queued (the queue is missing, access is denied, SQS kept throttling...)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"demand not queued ({code}): {detail}")
        self.code = code


class DemandQueue:
    def __init__(self, queue_url: str, client: SQSClient | None = None) -> None:
        self._url = queue_url
        self._client: SQSClient = client or aws_clients.client("sqs")

    def send(self, message: DemandMessage) -> str:
        """Queue one message; its SQS message id. Raises DemandQueueError when SQS did not take it."""
        try:
            response = self._client.send_message(QueueUrl=self._url, MessageBody=to_body(message))
        except ClientError as exc:
            raise DemandQueueError(error_code(exc), str(exc)) from exc
        return response["MessageId"]

    def hand_back(self, receipts: Mapping[str, int]) -> list[str]:
        """Make each received message (by receipt handle) invisible for its seconds from now, so SQS delivers
        it again then (Amazon SQS Developer Guide, "Amazon SQS visibility timeout": ChangeMessageVisibility
        sets a received message's timeout anew, counted from the call); the receipts it could not change
        (they come back after the queue's own visibility timeout instead)."""
        entries = list(receipts.items())
        unchanged: list[str] = []
        for start in range(0, len(entries), BATCH_LIMIT):
            chunk = entries[start : start + BATCH_LIMIT]
            try:
                response = self._client.change_message_visibility_batch(
                    QueueUrl=self._url,
                    Entries=[
                        {"Id": str(n), "ReceiptHandle": receipt, "VisibilityTimeout": seconds}
                        for n, (receipt, seconds) in enumerate(chunk)
                    ],
                )
            except ClientError:
                unchanged += [receipt for receipt, _ in chunk]
                continue
            unchanged += [chunk[int(failed["Id"])][0] for failed in response.get("Failed", [])]
        return unchanged
