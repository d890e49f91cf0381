"""Retrying a whole operation that AWS answered only in part, with capped exponential backoff and full jitter.

Not for single calls: botocore retries those (aws_clients.ATTEMPTS). A call can succeed and still
leave part of its work undone, which botocore cannot see: BatchGetItem answers with UnprocessedKeys
when it throttles some reads, and DynamoDB asks for the rest to be asked again "using an exponential
backoff algorithm" (https://docs.aws.amazon.com/amazondynamodb/latest/APIReference/API_BatchGetItem.html).
An operation says so by raising Unfinished; each of its calls is still retried by botocore within.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from runner_pool.adapters.aws_clients import ServiceBusyError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

T = TypeVar("T")


class Unfinished(Exception):  # noqa: N818 - a signal to retry, not an error anybody sees
    """The operation's call succeeded but left part of its work for another try."""


@dataclass(frozen=True)
class Backoff:
    attempts: int = 3
    base_seconds: float = 0.05
    cap_seconds: float = 2.0
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)

    def call(self, operation: Callable[[], T]) -> T:
        """Run `operation` until it finishes; ServiceBusyError if still unfinished after every attempt."""
        for attempt in range(self.attempts):
            try:
                return operation()
            except Unfinished as exc:
                if attempt == self.attempts - 1:
                    raise ServiceBusyError(f"still unfinished after {self.attempts} attempts: {exc}") from exc
                self.sleep(random.uniform(0, min(self.cap_seconds, self.base_seconds * 2**attempt)))  # noqa: S311
        raise AssertionError("unreachable: the loop returns or raises")


def read_consistently(
    client: DynamoDBClient, table: str, keys: Sequence[Mapping[str, Any]], backoff: Backoff
) -> list[Mapping[str, Any]]:
    """The items `keys` name (at most 100, BatchGetItem's limit), from one consistent BatchGetItem, and
    another for any key it left unprocessed; an item that does not exist is absent."""
    pending: dict[str, Any] = {table: {"Keys": list(keys), "ConsistentRead": True}}
    items: list[Mapping[str, Any]] = []

    def fetch() -> None:
        nonlocal pending
        response = client.batch_get_item(RequestItems=pending)
        items.extend(response["Responses"].get(table, []))
        pending = dict(response.get("UnprocessedKeys") or {})
        if pending:
            raise Unfinished(f"{len(pending[table]['Keys'])} keys unprocessed")

    # The one whole operation retried here: a BatchGetItem that succeeded but left keys unprocessed
    # (it does when some reads are throttled), which botocore's retries cannot see.
    backoff.call(fetch)
    return items
