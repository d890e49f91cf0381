"""SQS's ListQueues as AWS answers it while queues are being created: a list, never an error.

moto's backend lists its queues by iterating the dict that CreateQueue adds to, so a ListQueues that
meets a CreateQueue of another thread fails with "dictionary changed size during iteration" (seen when
two refreshes race: one opens notice queues while the other lists them). AWS's ListQueues answers with
the queues that exist ("Returns a list of your queues in the current region", Amazon SQS API
Reference, ListQueues). Here the listing reads a snapshot of the queues, so it answers as AWS does.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

from emulator.moto_internals import patch_point

_LIST_QUEUES = "moto.sqs.models:SQSBackend.list_queues"


def _list_queues(backend: Any, queue_name_prefix: str) -> list[Any]:
    prefix = re.compile(f"^{re.escape(queue_name_prefix)}" if queue_name_prefix else "")
    return [queue for name, queue in list(backend.queues.items()) if prefix.search(name)]


@contextmanager
def queues_listed_from_a_snapshot() -> Iterator[None]:
    """While inside, ListQueues reads a snapshot of the backend's queues."""
    owner, name = patch_point(_LIST_QUEUES)
    with mock.patch.object(owner, name, _list_queues):
        yield
