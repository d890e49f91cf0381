"""The demand queue over SQS: the webhook sends one message per delivery that asks for something.

The queue is a standard queue: the dispatcher groups, orders and deduplicates what it receives, so it
needs neither FIFO's ordering nor its five-minute deduplication (and a FIFO queue would hand the
dispatcher one message group at a time, defeating the batching of a matrix).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from runner_pool.adapters import aws_clients
from runner_pool.adapters.aws_clients import error_code
from runner_pool.domain.demand import DemandMessage, to_body

if TYPE_CHECKING:
    from mypy_boto3_sqs.client import SQSClient


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
