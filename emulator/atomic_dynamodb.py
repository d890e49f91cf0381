"""Gives moto's DynamoDB the item-level atomicity real DynamoDB has.

DynamoDB applies each write to an item, and its condition check, as one indivisible step, and a read
never sees half a write. moto checks the condition and then applies the update in separate Python
steps, so two threads can both pass the same condition. Serialising moto's item operations behind
one lock restores DynamoDB's guarantee; callers still race as hard as ever, so races test our
conditions and not moto's.

What an operation answers is a copy taken under the lock. moto's operations return its live items,
which its request handlers read after the lock is released (to write the answer, and
`DynamoHandler.update_item` deep-copies the item it is about to update), while another thread's
write changes the same item in place: a read saw half a write, or failed with "dictionary changed
size during iteration" (seen in tests/integration/test_lifecycle_stateful.py's race).
"""

from __future__ import annotations

import copy
import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from emulator.moto_internals import patch_point

_ITEM_OPERATIONS = tuple(
    f"moto.dynamodb.models:DynamoDBBackend.{name}"
    for name in (
        "put_item",
        "get_item",
        "update_item",
        "delete_item",
        "query",
        "scan",
        "batch_get_item",
        "batch_write_item",
        "transact_get_items",
        "transact_write_items",
    )
)
_lock = threading.RLock()


def _serialised(operation: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(operation)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with _lock:
            return copy.deepcopy(operation(*args, **kwargs))

    locked.__wrapped_by_runner_pool__ = True  # type: ignore[attr-defined]
    return locked


@contextmanager
def atomic_items() -> Iterator[None]:
    """While inside, every moto DynamoDB item operation runs alone, as it would in DynamoDB."""
    points = [patch_point(path) for path in _ITEM_OPERATIONS]
    originals = [(owner, name, getattr(owner, name)) for owner, name in points]
    already = any(getattr(op, "__wrapped_by_runner_pool__", False) for _, _, op in originals)
    if not already:
        for owner, name, operation in originals:
            setattr(owner, name, _serialised(operation))
    try:
        yield
    finally:
        if not already:
            for owner, name, operation in originals:
                setattr(owner, name, operation)
