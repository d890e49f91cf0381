"""The control plane's markers in the state table: runs that are over, and refresh's high-water marks.

The control plane's own markers (refresh's high-water marks) are items of their own, `pk` =
`marker#<name>`, outside both indexes.
"""

from __future__ import annotations

import uuid
from typing import Any

from runner_pool.adapters.aws_clients import Refusal, conditional_write
from runner_pool.adapters.state_items import (
    FINISHED_RUN_ITEM,
    FINISHED_RUN_PREFIX,
    MARKER_ATTRIBUTE,
    MARKER_ITEM,
    MARKER_MOVER,
    MARKER_PREFIX,
    TTL_ATTRIBUTE,
    attribute_value,
    from_item,
    item_key,
)
from runner_pool.adapters.state_reads import StateReads


class StateMarkers(StateReads):
    def mark_run_finished(self, run_key: str) -> None:
        """Note that a run attempt is over (its release began), so a provision still in flight for its
        run key gives back what it holds instead of setting it running. The run key names the attempt
        (domain.run_keys): a re-run's provision, under its own key, never finds its earlier attempt's
        mark. Expires with the terminated records."""
        now = self._clock.now()
        item = {
            **item_key(FINISHED_RUN_PREFIX + run_key, FINISHED_RUN_ITEM),
            "finished_at": attribute_value(now),
            TTL_ATTRIBUTE: attribute_value(self._expiry(now)),
        }
        self._client.put_item(TableName=self._table, Item=item)

    def run_finished(self, run_key: str) -> bool:
        response = self._client.get_item(
            TableName=self._table,
            Key=item_key(FINISHED_RUN_PREFIX + run_key, FINISHED_RUN_ITEM),
            ConsistentRead=True,
        )
        return "Item" in response

    def read_marker(self, name: str) -> float | None:
        """A marker's value (e.g. refresh's redelivery high-water mark); None if it was never set."""
        response = self._client.get_item(
            TableName=self._table, Key=item_key(MARKER_PREFIX + name, MARKER_ITEM), ConsistentRead=True
        )
        item = response.get("Item")
        return None if item is None else float(from_item(item)[MARKER_ATTRIBUTE])

    def move_marker(self, name: str, value: float, *, expected: float | None) -> bool:
        """Compare-and-set: the marker becomes `value` only if it still is `expected` (None: not set yet).

        Runs that overlap (two refreshes) both read a marker; whichever moves it first owns what it
        stands for, and the other gets False and leaves that work alone. A move whose answer was lost
        and that is retried (by botocore) meets its own write: the token it wrote beside
        the value tells it so, and it has won.
        """
        mover = uuid.uuid4().hex
        values: dict[str, Any] = {":value": attribute_value(value), ":mover": {"S": mover}}
        if expected is None:
            condition = "attribute_not_exists(pk)"
        else:
            condition = f"{MARKER_ATTRIBUTE} = :expected"
            values[":expected"] = attribute_value(expected)
        answer = conditional_write(
            lambda: self._client.update_item(
                TableName=self._table,
                Key=item_key(MARKER_PREFIX + name, MARKER_ITEM),
                UpdateExpression=f"SET {MARKER_ATTRIBUTE} = :value, {MARKER_MOVER} = :mover",
                ConditionExpression=condition,
                ExpressionAttributeValues=values,
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        )
        if isinstance(answer, Refusal):
            return bool(answer.item.get(MARKER_MOVER, {}).get("S") == mover)
        return True
