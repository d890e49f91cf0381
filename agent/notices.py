"""The agent's ear: it long-polls its instance's notice queue and wakes the loop when a notice arrives.

The control plane sends a notice right after it changes the instance's record in a way the agent must
act on (a runner config handed over, a run key released; runner_pool.domain.notices). The loop then
reads its record at once instead of at its next watch period: a claim is heard in the time SQS takes to
deliver a message, at the cost of three empty long polls a minute while the instance is idle.

A notice is a hint, never an order: whatever it says, the loop acts only on what the record says. So a
queue that is missing (refresh opens it later), a receive that fails, or a notice lost costs only time:
the listener waits its watch period and tries again, and the loop still reads the record every period.
"""

from __future__ import annotations

import contextvars
import threading
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from agent.aws_errors import AWS_FAILURES, Fault, fault_of
from agent.log import EventLog


class Wakeup:
    """What the loop waits on between looks: a notice, a stop, or its watch period running out."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._woken = False

    def wake(self) -> None:
        with self._condition:
            self._woken = True
            self._condition.notify_all()

    def wait(self, timeout: float) -> bool:
        """True when woken (now or since the last wait) rather than timed out."""
        with self._condition:
            woken = self._condition.wait_for(lambda: self._woken, timeout)
            self._woken = False
            return woken

    def wake_on(self, stop: threading.Event) -> None:
        """Wake the loop when `stop` is set, so a stop is acted on at once, not after the watch period."""

        def relay() -> None:
            stop.wait()
            self.wake()

        threading.Thread(target=relay, name="stop-relay", daemon=True).start()


@dataclass(eq=False)
class NoticeListener:
    """Receives from one queue until `stop` is set; each batch received wakes the loop, then is deleted."""

    sqs: Any
    queue_url: str
    _: KW_ONLY
    wait_seconds: int
    retry_seconds: float
    log: EventLog
    _failing: Fault | None = field(default=None, init=False)
    """The fault the latest receive failed with (None once one succeeds): each new fault is logged once."""

    def start(self, stop: threading.Event, wakeup: Wakeup) -> threading.Thread:
        """Listen in a thread of its own, waking `wakeup` at each notice, until `stop` is set."""
        # In a copy of the caller's context: what the caller's context variables hold (the emulator's
        # IAM check names the instance acting there) holds for the listener's calls too.
        context = contextvars.copy_context()
        thread = threading.Thread(
            target=context.run, args=(self.listen, stop, wakeup), name="notices", daemon=True
        )
        thread.start()
        return thread

    def listen(self, stop: threading.Event, wakeup: Wakeup) -> None:
        while not stop.is_set():
            if not self.receive_once(wakeup) and not stop.is_set():
                stop.wait(self.retry_seconds)

    def receive_once(self, wakeup: Wakeup) -> bool:
        """One long poll; False when it failed (the caller waits before the next)."""
        try:
            answer = self.sqs.receive_message(
                QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=self.wait_seconds
            )
        except AWS_FAILURES as exc:
            fault = fault_of(exc)
            if fault is not self._failing:
                self.log.warning(
                    "notices not received; reading the record every watch period",
                    fault=fault,
                    error=str(exc),
                )
            self._failing = fault
            return False
        if self._failing is not None:
            self.log.info("notices received again")
            self._failing = None
        messages = answer.get("Messages", [])
        if not messages:
            return True
        wakeup.wake()
        try:
            self.sqs.delete_message_batch(
                QueueUrl=self.queue_url,
                Entries=[
                    {"Id": str(number), "ReceiptHandle": message["ReceiptHandle"]}
                    for number, message in enumerate(messages)
                ],
            )
        except AWS_FAILURES as exc:
            # Received again after the visibility timeout: one more look at the record, no harm.
            self.log.warning("notices not deleted", fault=fault_of(exc), error=str(exc))
        return True
