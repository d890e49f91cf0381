"""Local AWS's SQS hands a received message to one consumer only, and a FIFO group's next message to no
one while the group is in flight, however many receives run at once (emulator/atomic_sqs.py): "Amazon
SQS prevents all consumers from receiving and processing the message" during its visibility timeout
(Amazon SQS Developer Guide, "Amazon SQS visibility timeout"); "you can't receive additional messages
from the same message group ID in subsequent requests unless the currently received messages are
deleted or they become visible again" ("FIFO queue delivery logic in Amazon SQS")."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest

from emulator.moto_internals import patch_point

HOLD_SECONDS = 1.0
"""How long the first receive holds its message half taken while a second receive runs: the second
answers at once where nothing keeps it out (moto alone), and cannot answer before the first has
finished where its queue keeps it out; past this the first goes on regardless, so that the test ends."""


@pytest.fixture
def first_receive_held() -> Iterator[tuple[threading.Event, threading.Event]]:
    """(taking, answered): the first message any receive marks received is held, `taking` set, between
    moto noting it pending and marking it received, until `answered` is set (or HOLD_SECONDS pass)."""
    taking, answered = threading.Event(), threading.Event()
    owner, name = patch_point("moto.sqs.models:Message.mark_received")
    mark = getattr(owner, name)

    def held(message: Any, visibility_timeout: int | None = None) -> None:
        if not taking.is_set():
            taking.set()
            answered.wait(HOLD_SECONDS)
        mark(message, visibility_timeout)

    with mock.patch.object(owner, name, held):
        yield taking, answered


@pytest.mark.parametrize(
    ("attributes", "second_gets"),
    [
        ({}, ["1"]),
        ({"FifoQueue": "true", "ContentBasedDeduplication": "true"}, []),
    ],
    ids=["standard-queue", "fifo-queue-one-group"],
)
def test_two_receives_at_once_never_take_one_message_twice_nor_a_busy_groups_next(
    sqs: Any,
    first_receive_held: tuple[threading.Event, threading.Event],
    attributes: dict[str, str],
    second_gets: list[str],
) -> None:
    taking, answered = first_receive_held
    # Given a queue of two messages (one group when FIFO)
    name = "demand.fifo" if attributes else "demand"
    url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    group = {"MessageGroupId": "run-1"} if attributes else {}
    for body in ("0", "1"):
        sqs.send_message(QueueUrl=url, MessageBody=body, **group)

    def receive() -> list[str]:
        answer = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=30)
        return [message["Body"] for message in answer.get("Messages", [])]

    # When one receive is taking the first message while a second receive runs
    first: list[str] = []
    reader = threading.Thread(target=lambda: first.extend(receive()))
    reader.start()
    assert taking.wait(10), "the first receive never took a message"
    second = receive()
    answered.set()
    reader.join(10)

    # Then the first message was the first receive's alone; the second got the next (standard), or
    # nothing while the group is in flight (FIFO)
    assert first == ["0"]
    assert second == second_gets


@pytest.fixture
def scan_held() -> Iterator[tuple[threading.Event, threading.Event]]:
    """(paused, resume): a receive in a thread named "paused" that has listed message "0" as visible is
    held at its own check of it, `paused` set, until `resume` is set (or HOLD_SECONDS pass)."""
    paused, resume = threading.Event(), threading.Event()
    owner, name = patch_point("moto.sqs.models:Message.visible")
    visible = getattr(owner, name)
    looks = [0]

    def held(message: Any) -> bool:
        seen = bool(visible.fget(message))
        if threading.current_thread().name == "paused" and message.body == "0" and seen:
            looks[0] += 1
            if looks[0] == 2:  # the first look lists the queue's visible messages, the second is the scan's
                paused.set()
                resume.wait(HOLD_SECONDS)
        return seen

    with mock.patch.object(owner, name, property(held)):
        yield paused, resume


def test_a_message_received_handled_and_deleted_during_another_receives_scan_stays_deleted(
    sqs: Any, scan_held: tuple[threading.Event, threading.Event]
) -> None:
    paused, resume = scan_held
    # Given a FIFO queue of three messages of one group
    url = sqs.create_queue(
        QueueName="demand.fifo", Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"}
    )["QueueUrl"]
    for body in ("0", "1", "2"):
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId="run-1")
    handed: list[dict[str, Any]] = []

    def receive() -> None:
        answer = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=30)
        handed.extend(answer.get("Messages", []))

    # When a receive has found the first message visible and loses the CPU while another receive takes
    # that message and its consumer deletes it
    slow = threading.Thread(target=receive, name="paused")
    slow.start()
    assert paused.wait(10), "the receive never looked at the first message"
    receive()
    deletes = [
        sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": "0", "ReceiptHandle": m["ReceiptHandle"]}])
        for m in list(handed)
    ]
    resume.set()
    slow.join(10)

    # Then the first message was handed out once, and the group's next messages come once it is deleted
    # (moto alone handed it out again, under a receipt no delete accepts, its group blocked for good)
    assert [m["Body"] for m in handed] == ["0"]
    deletes += [
        sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": "0", "ReceiptHandle": m["ReceiptHandle"]}])
        for m in handed[len(deletes) :]
    ]
    assert all(not answer.get("Failed") for answer in deletes)
    after = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=30)
    assert [m["Body"] for m in after.get("Messages", [])] == ["1", "2"]
