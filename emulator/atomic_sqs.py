"""Gives moto's SQS queues the atomic receive real SQS has: a message received is one consumer's.

SQS hides a received message from every other consumer for its visibility timeout ("a period of time
during which Amazon SQS prevents all consumers from receiving and processing the message", Amazon SQS
Developer Guide, "Amazon SQS visibility timeout"), and a FIFO queue hands out no more of a message
group while some of it is in flight ("you can't receive additional messages from the same message group
ID in subsequent requests unless the currently received messages are deleted or they become visible
again", "FIFO queue delivery logic in Amazon SQS").

moto's `SQSBackend.receive_message` scans the queue and marks what it takes in separate Python steps,
with no lock, and its server runs each request in a thread of its own. Two receives at once could both
take one message (the second sees it still visible, pending and "timed out", and takes it again), or
take a group's next message from a snapshot of the pending groups taken before the first marked its
own. Worse, a receive that found a message visible and then lost the CPU while another receive took
it, had it handled and deleted, went on to take the deleted message: noted pending again under a
receipt no delete accepts, it blocked its FIFO group for good. Its delete rebuilds the queue's list of
messages from a copy, so two deletes at once could put a deleted message back. The event source's five
pollers (emulator/event_sources.py) on a FIFO queue under load are exactly such receives and deletes
(tests/e2e/test_emulator_parts.py's FIFO scenario timed out so in CI, its group's last messages never
handed out). Here each receive, delete and change of visibility runs alone on its queue,
under the queue's own condition: a long poll's wait (`Queue.wait_for_messages`) releases it, as a send
(`Queue.add_message`, which notifies it) takes it, so waiting receives do not hold up other callers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest import mock

from emulator.moto_internals import patch_point

_QUEUE_OPERATIONS = tuple(
    f"moto.sqs.models:SQSBackend.{name}"
    for name in ("receive_message", "delete_message", "change_message_visibility")
)


def _alone_on_its_queue(operation: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(operation)
    def alone(backend: Any, queue_name: str, *args: Any, **kwargs: Any) -> Any:
        # moto's queue condition is over an RLock: the operation's own wait releases it entirely.
        with backend.get_queue(queue_name)._messages_lock:
            return operation(backend, queue_name, *args, **kwargs)

    return alone


@contextmanager
def atomic_queues() -> Iterator[None]:
    """While inside, each of moto's SQS receives, deletes and visibility changes runs alone on its queue,
    as SQS's own would (a receive that waits lets the others in while it waits)."""
    with ExitStack() as stack:
        for path in _QUEUE_OPERATIONS:
            owner, name = patch_point(path)
            stack.enter_context(mock.patch.object(owner, name, _alone_on_its_queue(getattr(owner, name))))
        yield
