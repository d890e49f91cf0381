"""SQS's long poll as AWS answers it: a message made visible again wakes a receive that is waiting.

Long polling lets "Amazon SQS ... wait a specified time for a message to become available in the queue
before sending a response" (boto3 guide, "Enabling long polling in Amazon SQS"; Amazon SQS Developer
Guide, "Amazon SQS short and long polling": long polling returns messages as soon as they become
available). A message becomes available when it is sent, and when its visibility timeout is changed
to 0 (ChangeMessageVisibility: "the message is immediately visible to other consumers").

moto wakes a waiting receive only when a message is sent (`Queue.add_message` notifies the queue's
condition). A released message (a pickup letting go of the misfits it held, domain/pickup.py) stayed
unseen by a receive already waiting, until that wait ended: with the pool's 1 s long poll the receive
came back empty, and a request reading the pool while another held its messages launched cold where
SQS would have handed it the released instance. Here a change of
visibility wakes the queue's waiting receives, which then look again as they do after a send.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

from emulator.moto_internals import patch_point

_CHANGE_VISIBILITY = "moto.sqs.models:SQSBackend.change_message_visibility"


def _wakes_waiting_receives(change: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(change)
    def changed(backend: Any, queue_name: str, receipt_handle: str, visibility_timeout: int) -> None:
        change(backend, queue_name, receipt_handle, visibility_timeout)
        if int(visibility_timeout) == 0:
            condition = backend.get_queue(queue_name)._messages_lock
            with condition:
                condition.notify_all()

    return changed


@contextmanager
def released_messages_wake_long_polls() -> Iterator[None]:
    """While inside, a message made visible at once (its visibility timeout changed to 0) wakes every
    receive waiting on its queue, as a sent message does. ChangeMessageVisibilityBatch goes through
    the same method for each entry."""
    owner, name = patch_point(_CHANGE_VISIBILITY)
    with mock.patch.object(owner, name, _wakes_waiting_receives(getattr(owner, name))):
        yield
