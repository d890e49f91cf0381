"""What every item of the demand ledger shares: the table's key and TTL attributes, how a number is
written."""

from __future__ import annotations

from runner_pool.domain.clock import Epoch

KEY_ATTRIBUTE = "id"
EXPIRY_ATTRIBUTE = "expiration"
"""Powertools idempotency's attribute names, so one table and one TTL setting serve both."""


def number(value: Epoch) -> str:
    """A time as DynamoDB's number type takes it, exactly as Python holds it."""
    return repr(float(value))
