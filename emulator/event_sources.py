"""What invokes our Lambdas besides API Gateway and Step Functions: an SQS event source and a schedule.

`QueueEventSource` plays Lambda's SQS event source mapping with the concurrency it has on AWS
(Lambda Developer Guide, "Configuring scaling behavior for SQS event source mappings",
https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-scaling.html): for a standard queue
"Lambda starts processing five batches at a time with five concurrent invocations of your
function", so five pollers here, each of which receives, gathers messages until its batch is full
or the batching window has passed since its first message, invokes the function with its batch, and
deletes every message except those the function reports as failed (ReportBatchItemFailures). Two
messages sent a moment apart therefore often land in two batches handled at the same time. (AWS
then adds up to 300 pollers a minute while messages remain; five is the floor, and the worst case
for batching a matrix is already there.) For a FIFO queue, "Amazon SQS ensures that messages in the
same group are delivered to Lambda in order" and "the function attempts all retries on the affected
messages before Lambda receives additional messages from the same group": SQS itself (moto too)
hands out no message of a group while another of it is in flight, so the pollers need no rule of
their own. The parameters are checked as Lambda checks them ("Lambda parameters for Amazon SQS event
source mappings", services-sqs-parameters.html, and CreateEventSourceMapping's BatchSize): a FIFO
queue takes batches of at most 10 and no batching window, and a batch larger than 10 needs a window
of at least 1 s. When the function raises, nothing is deleted, and the messages come back after
their visibility timeout, as on AWS. `Schedule` plays an EventBridge rule with a rate: it invokes
the function with a scheduled event every period.

Their own SQS calls are the event source's, not the function's, so they go through a client of
their own (not counted with the control plane's calls).
"""

from __future__ import annotations

import queue
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
"""Lambda long-polls for 20 s; 1 s here, so a stopping event source is not held up for long."""
STANDARD_QUEUE_POLLERS = 5
"""services-sqs-scaling.html: "five batches at a time with five concurrent invocations"."""
FIFO_BATCH_LIMIT = 10
"""services-sqs-parameters.html: BatchSize "For FIFO queues, the maximum is 10"."""


class _Invoker:
    def __init__(
        self, handler: Handler, function_name: str, *, threads: int = 1, one_at_a_time: bool = False
    ) -> None:
        self.handler = handler
        self.function_name = function_name
        self.invocations = 0
        self.failures = 0
        self._counting = threading.Lock()
        self._one_at_a_time = threading.Lock() if one_at_a_time else None
        """Set when the handler runs in this process: its module globals (Powertools' batch processor)
        are one execution environment's, which Lambda never gives two invocations at once."""
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, name=f"{function_name}-{n}", daemon=True)
            for n in range(threads)
        ]

    @property
    def concurrency(self) -> int:
        """How many invocations this source can have under way at once (its pollers)."""
        return len(self._threads)

    def __enter__(self) -> Self:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def invoke(self, event: dict[str, Any]) -> Any:
        with self._counting:
            self.invocations += 1
        context = LambdaContext(self.function_name, str(uuid.uuid4()), function_arn(self.function_name))
        try:
            if self._one_at_a_time is None:
                return self.handler(event, context)
            with self._one_at_a_time:
                return self.handler(event, context)
        except Exception:
            with self._counting:
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
        batch_size: int = 10,
        window_seconds: float = 0.0,
        pollers: int = STANDARD_QUEUE_POLLERS,
        one_at_a_time: bool = False,
    ) -> None:
        name = queue_url.rsplit("/", 1)[-1]
        _check_mapping(fifo=name.endswith(".fifo"), batch_size=batch_size, window_seconds=window_seconds)
        super().__init__(handler, function_name, threads=pollers, one_at_a_time=one_at_a_time)
        self._sqs = sqs
        self._queue_url = queue_url
        self._queue_arn = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"
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


def _check_mapping(*, fifo: bool, batch_size: int, window_seconds: float) -> None:
    """Refuse what CreateEventSourceMapping refuses, so the emulator never runs a mapping AWS would not."""
    if fifo and window_seconds:
        raise ValueError("Batching window is not supported for FIFO queues (services-sqs-parameters.html)")
    if fifo and batch_size > FIFO_BATCH_LIMIT:
        raise ValueError(f"a FIFO queue's batch size is at most {FIFO_BATCH_LIMIT}, not {batch_size}")
    if batch_size > SQS_RECEIVE_LIMIT and window_seconds < 1:
        raise ValueError(
            f"a batch size of {batch_size} (above 10) needs a batching window of at least 1 s "
            "(MaximumBatchingWindowInSeconds, CreateEventSourceMapping)"
        )


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


class EventRule(_Invoker):
    """An EventBridge rule whose target is the function: `put` hands it an event that matched, delivered
    asynchronously in the rule's thread, a failed invocation retried up to `retry_attempts` times (the
    target's RetryPolicy; EventBridge User Guide, "Event retry policy and using dead-letter queues")."""

    def __init__(self, handler: Handler, function_name: str, *, retry_attempts: int) -> None:
        super().__init__(handler, function_name)
        self._retries = retry_attempts
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._idle = threading.Event()
        self._idle.set()

    def put(self, event: dict[str, Any]) -> None:
        self._idle.clear()
        self._events.put(event)

    def delivered(self, timeout: float) -> bool:
        """Whether every event put so far has been delivered (or given up on) within `timeout`."""
        return self._idle.wait(timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                event = self._events.get(timeout=LONG_POLL_SECONDS)
            except queue.Empty:
                continue
            for _attempt in range(1 + self._retries):
                try:
                    self.invoke(event)
                    break
                except Exception:  # noqa: S112 - retried as the target's retry policy says
                    continue
            if self._events.empty():
                self._idle.set()


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
