"""What went wrong with an AWS call, in the agent's words: the one agent module that knows botocore's errors.

Every call the agent makes is retried by botocore first (runner_pool.adapters.aws_clients.ATTEMPTS);
what reaches the agent is the answer after the last attempt, and the agent's own loop tries again
later whatever it is. The kind only says how to report it, and whether the thing is already gone.
"""

from __future__ import annotations

from enum import StrEnum

from botocore.exceptions import BotoCoreError, ClientError

from runner_pool.adapters.aws_clients import ServiceBusyError, ServiceUnreachableError, error_code, is_busy

NOT_FOUND_CODES = frozenset({"ResourceNotFoundException", "InvalidInstanceID.NotFound", "NotFoundException"})
CONDITION_FAILED_CODES = frozenset({"ConditionalCheckFailedException", "TransactionCanceledException"})


class Fault(StrEnum):
    THROTTLED = "throttled"
    """AWS stayed busy through botocore's attempts (throttling or a transient 5xx)."""
    NOT_FOUND = "not found"
    CONDITION_FAILED = "condition failed"
    OTHER = "other"
    """Refused (e.g. access denied), or AWS not reached at all (no network, a timeout)."""


AWS_FAILURES: tuple[type[Exception], ...] = (
    ClientError,
    BotoCoreError,
    ServiceBusyError,
    ServiceUnreachableError,
)
"""What an AWS call can raise: catch these, and ask `fault_of` what it was."""


def fault_of(exc: BaseException) -> Fault | None:  # noqa: PLR0911 - one return per kind
    """The kind of an AWS call's failure; None when `exc` is not one."""
    if isinstance(exc, ServiceBusyError):
        return Fault.THROTTLED
    if isinstance(exc, ClientError):
        code = error_code(exc)
        if is_busy(code, exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")):
            return Fault.THROTTLED
        if code in NOT_FOUND_CODES:
            return Fault.NOT_FOUND
        if code in CONDITION_FAILED_CODES:
            return Fault.CONDITION_FAILED
        return Fault.OTHER
    if isinstance(exc, (BotoCoreError, ServiceUnreachableError)):
        return Fault.OTHER
    return None
