"""`make bench agent`'s idle DynamoDB price: each request priced as DynamoDB bills it (bench/agent.py)."""

from __future__ import annotations

import pytest

from bench.agent import MINUTES_PER_MONTH, Window
from bench.emulator import DYNAMODB_PER_READ, DYNAMODB_PER_WRITE


def _window(calls: dict[str, float]) -> Window:
    dynamodb = sum(n for name, n in calls.items() if name.startswith("dynamodb:"))
    return Window(0.0, 0.0, dynamodb, 0.0, calls)


def test_an_agents_batch_read_is_billed_as_the_two_reads_it_makes_not_as_a_write() -> None:
    # Given a minute of 4 record reads, 2 heartbeat writes and one notice's batch read (record + config)
    window = _window({"dynamodb:GetItem": 4, "dynamodb:PutItem": 2, "dynamodb:BatchGetItem": 1})
    # Then it costs 6 reads and 2 writes a minute (DynamoDB bills a BatchGetItem per item it reads)
    expected = (6 * DYNAMODB_PER_READ + 2 * DYNAMODB_PER_WRITE) * MINUTES_PER_MONTH
    assert window.dynamodb_dollars_per_month == pytest.approx(expected)
