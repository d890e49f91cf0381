"""Local AWS's SQS answers a waiting long poll as SQS does (emulator/sqs_long_polls.py): a message made
visible again, by ChangeMessageVisibility or its batch with a timeout of 0, is handed to a receive that
is already waiting ("the message is immediately visible to other consumers", Amazon SQS API Reference,
ChangeMessageVisibility; long polling waits "for a message to become available", Amazon SQS Developer
Guide, "Amazon SQS short and long polling")."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest

from emulator.moto_internals import patch_point

POOL_LONG_POLL_SECONDS = 1
"""The pool queues' long poll (adapters/pool_queues.py): one wait, after which moto answers."""


@pytest.fixture
def waiting() -> Iterator[threading.Event]:
    """Set once a receive has found nothing and waits on its queue."""
    entered = threading.Event()
    owner, name = patch_point("moto.sqs.models:Queue.wait_for_messages")
    wait = getattr(owner, name)

    def noted(queue: Any, timeout: int) -> None:
        entered.set()
        wait(queue, timeout)

    with mock.patch.object(owner, name, noted):
        yield entered


def held_message(sqs: Any) -> tuple[str, str]:
    """A queue whose one message a reader holds (in flight for 30 s): its URL and the receipt."""
    url = sqs.create_queue(QueueName="pool-large")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="i-0123456789abcdef0")
    (message,) = sqs.receive_message(QueueUrl=url, VisibilityTimeout=30)["Messages"]
    return url, message["ReceiptHandle"]


def received_while(sqs: Any, url: str, waiting: threading.Event, release: Callable[[], Any]) -> list[str]:
    """What a long poll already waiting on the queue receives when `release` runs during its wait."""
    got: list[str] = []
    reader = threading.Thread(
        target=lambda: got.extend(
            m["Body"]
            for m in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=POOL_LONG_POLL_SECONDS).get(
                "Messages", []
            )
        )
    )
    reader.start()
    assert waiting.wait(10), "the long poll never waited"
    release()
    reader.join(10)
    return got


@pytest.mark.parametrize(
    ("visibility_seconds", "handed"),
    [(0, ["i-0123456789abcdef0"]), (20, [])],
    ids=["released-is-handed-over", "held-longer-is-not"],
)
def test_a_message_made_visible_during_a_long_poll_is_handed_to_it(
    sqs: Any, waiting: threading.Event, visibility_seconds: int, handed: list[str]
) -> None:
    url, receipt = held_message(sqs)
    got = received_while(
        sqs,
        url,
        waiting,
        lambda: sqs.change_message_visibility(
            QueueUrl=url, ReceiptHandle=receipt, VisibilityTimeout=visibility_seconds
        ),
    )
    assert got == handed


def test_a_message_released_by_a_batch_during_a_long_poll_is_handed_to_it(
    sqs: Any, waiting: threading.Event
) -> None:
    url, receipt = held_message(sqs)
    entry = {"Id": "0", "ReceiptHandle": receipt, "VisibilityTimeout": 0}
    got = received_while(
        sqs, url, waiting, lambda: sqs.change_message_visibility_batch(QueueUrl=url, Entries=[entry])
    )
    assert got == ["i-0123456789abcdef0"]
