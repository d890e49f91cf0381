"""What invokes our Lambdas besides API Gateway and Step Functions: an SQS event source and a schedule.

`QueueEventSource` plays Lambda's SQS event source mapping: it polls the queue, gathers messages
until the batch is full or the batching window has passed since the first, invokes the function
with the batch, and deletes every message except those the function reports as failed
(ReportBatchItemFailures). When the function raises, nothing is deleted, and the messages come
back after their visibility timeout, as on AWS. `Schedule` plays an EventBridge rule with a rate:
it invokes the function with a scheduled event every period.

Their own SQS calls are the event source's, not the function's, so they go through a client of
their own (not counted with the control plane's calls).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self

from emulator.aws import ACCOUNT, REGION
from emulator.step_functions import LambdaContext, function_arn

Handler = Callable[[dict[str, Any], Any], Any]
SQS_RECEIVE_LIMIT = 10
LONG_POLL_SECONDS = 1


class _Invoker:
    def __init__(self, handler: Handler, function_name: str) -> None:
        self.handler = handler
        self.function_name = function_name
        self.invocations = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=function_name, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()

    def invoke(self, event: dict[str, Any]) -> Any:
        self.invocations += 1
        context = LambdaContext(self.function_name, str(uuid.uuid4()), function_arn(self.function_name))
        try:
            return self.handler(event, context)
        except Exception:
            self.failures += 1
            raise

    def _loop(self) -> None:
        raise NotImplementedError


class QueueEventSource(_Invoker):
    def __init__(
        self,
        handler: Handler,
        function_name: str,
        *,
        sqs: Any,
        queue_url: str,
        batch_size: int = 100,
        window_seconds: float = 2.0,
    ) -> None:
        super().__init__(handler, function_name)
        self._sqs = sqs
        self._queue_url = queue_url
        self._queue_arn = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{queue_url.rsplit('/', 1)[-1]}"
        self._batch_size = batch_size
        self._window = window_seconds

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                batch = self._gather()
                if batch:
                    self._deliver(batch)
            except Exception:  # noqa: S112 - a failed poll or invocation: the messages come back; poll again
                continue

    def _gather(self) -> list[dict[str, Any]]:
        batch: list[dict[str, Any]] = []
        deadline: float | None = None
        while len(batch) < self._batch_size and not self._stop.is_set():
            left = LONG_POLL_SECONDS if deadline is None else deadline - time.monotonic()
            if left <= 0:
                break
            received = self._sqs.receive_message(
                QueueUrl=self._queue_url,
                MaxNumberOfMessages=min(SQS_RECEIVE_LIMIT, self._batch_size - len(batch)),
                WaitTimeSeconds=max(0, min(LONG_POLL_SECONDS, int(left))),
                AttributeNames=["All"],
                MessageAttributeNames=["All"],
            ).get("Messages", [])
            if received and deadline is None:
                deadline = time.monotonic() + self._window
            batch += received
            if not received and deadline is None:
                return batch
        return batch

    def _deliver(self, batch: list[dict[str, Any]]) -> None:
        event = {"Records": [self._record(message) for message in batch]}
        answer = self.invoke(event) or {}
        failed = {item["itemIdentifier"] for item in answer.get("batchItemFailures", [])}
        done = [m for m in batch if m["MessageId"] not in failed]
        for start in range(0, len(done), SQS_RECEIVE_LIMIT):
            self._sqs.delete_message_batch(
                QueueUrl=self._queue_url,
                Entries=[
                    {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]}
                    for n, m in enumerate(done[start : start + SQS_RECEIVE_LIMIT])
                ],
            )

    def _record(self, message: dict[str, Any]) -> dict[str, Any]:
        """A message as the event source hands it to the function."""
        return {
            "messageId": message["MessageId"],
            "receiptHandle": message["ReceiptHandle"],
            "body": message["Body"],
            "attributes": message.get("Attributes", {}),
            "messageAttributes": {
                name: {
                    "stringValue": value.get("StringValue"),
                    "binaryValue": value.get("BinaryValue"),
                    "stringListValues": [],
                    "binaryListValues": [],
                    "dataType": value["DataType"],
                }
                for name, value in message.get("MessageAttributes", {}).items()
            },
            "md5OfBody": message.get("MD5OfBody", ""),
            "eventSource": "aws:sqs",
            "eventSourceARN": self._queue_arn,
            "awsRegion": REGION,
        }


class Schedule(_Invoker):
    def __init__(self, handler: Handler, function_name: str, *, every_seconds: float, rule: str) -> None:
        super().__init__(handler, function_name)
        self._every = every_seconds
        self._rule = rule

    def _loop(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self.invoke(scheduled_event(time.time(), self._rule))
            except Exception:  # noqa: S112 - a failed run is the next run's to finish, as on AWS
                continue


def scheduled_event(at: float, rule: str) -> dict[str, Any]:
    """What EventBridge sends a scheduled rule's target; `time` is the schedule slot."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": ACCOUNT,
        "time": datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": REGION,
        "resources": [f"arn:aws:events:{REGION}:{ACCOUNT}:rule/{rule}"],
        "detail": {},
    }
