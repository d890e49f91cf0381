"""What every item of the demand ledger shares: the table's key and TTL attributes, how a number is
written, and how a conditional write's refusal reads."""

from __future__ import annotations

from collections.abc import Callable

from botocore.exceptions import ClientError

from runner_pool.adapters.aws_clients import error_code
from runner_pool.domain.clock import Epoch

KEY_ATTRIBUTE = "id"
EXPIRY_ATTRIBUTE = "expiration"
"""Powertools idempotency's attribute names, so one table and one TTL setting serve both."""


def conditional(write: Callable[[], object]) -> bool:
    """Run a conditional write; False when its condition did not hold."""
    try:
        write()
    except ClientError as exc:
        if error_code(exc) == "ConditionalCheckFailedException":
            return False
        raise
    return True


def number(value: Epoch) -> str:
    """A time as DynamoDB's number type takes it, exactly as Python holds it."""
    return repr(float(value))
