"""Retrying AWS calls that were throttled, with capped exponential backoff and full jitter."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from botocore.exceptions import ClientError

T = TypeVar("T")

THROTTLING_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "ThrottlingException",
        "Throttling",
        "TooManyRequestsException",
        "RequestThrottled",
        "RequestThrottledException",
        "SlowDown",
        "InternalServerError",
        "ServiceUnavailable",
    }
)


class ServiceBusyError(RuntimeError):
    """AWS kept throttling past every retry; the caller's own retry (Lambda, Step Functions) is next."""


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


@dataclass(frozen=True)
class Backoff:
    attempts: int = 6
    base_seconds: float = 0.05
    cap_seconds: float = 2.0
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)

    def call(self, operation: Callable[[], T]) -> T:
        """Run `operation`, retrying only throttling; every other error goes straight to the caller."""
        for attempt in range(self.attempts):
            try:
                return operation()
            except ClientError as exc:
                if error_code(exc) not in THROTTLING_CODES:
                    raise
                if attempt == self.attempts - 1:
                    raise ServiceBusyError(f"still throttled after {self.attempts} attempts: {exc}") from exc
                self.sleep(random.uniform(0, min(self.cap_seconds, self.base_seconds * 2**attempt)))  # noqa: S311
        raise AssertionError("unreachable: the loop returns or raises")
