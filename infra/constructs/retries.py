"""How a state machine tries a task again: the named policies, one of which each Step of a machine takes.

The ASL file stays the definition deployed as is; the Step says which policy its task follows, and the
machine's construct refuses to synthesise a task whose Retry is not that policy (infra/constructs/
workflow.py). The errors a policy names are Step Functions' own, Lambda's, and the product's, by the
class names its Lambdas raise, never a botocore class (adapters/aws_clients.py translates those).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runner_pool.adapters.aws_clients import ServiceBusyError, ServiceUnreachableError
from runner_pool.domain.executions import MalformedRequestError
from runner_pool.domain.labels import LabelError

ANY_ERROR = ("States.ALL",)
LAMBDA_REFUSED = ("Lambda.ServiceException", "Lambda.SdkClientException")
"""Lambda did not run the function, or failed to answer (the Step Functions guide's "Handle transient
Lambda service exceptions": https://docs.aws.amazon.com/step-functions/latest/dg/bp-lambda-serviceexception.html)."""
LAMBDA_THROTTLED = ("Lambda.TooManyRequestsException",)
"""Lambda refused to run the function because the account's (or function's) concurrency was all in use
(Lambda Developer Guide, "Understanding Lambda function scaling": an invocation beyond the concurrency
available is throttled with TooManyRequestsException, 429)."""
LAMBDA_TIMED_OUT = (
    "Sandbox.Timedout",
    "Lambda.Unknown",
    "States.Timeout",
    "Lambda.ClientExecutionTimeoutException",
)
"""The function ran past its timeout, or its answer was lost: its effect may have happened."""


@dataclass(frozen=True)
class Retrier:
    """One entry of a task's Retry, as ASL writes it."""

    errors: tuple[str, ...]
    max_attempts: int
    interval_seconds: int | None = None
    backoff_rate: float | None = None
    max_delay_seconds: int | None = None
    full_jitter: bool = False
    """JitterStrategy FULL: each wait a random share of its computed length, so tasks throttled together
    do not all come back together."""

    def asl(self) -> dict[str, Any]:
        fields = {
            "IntervalSeconds": self.interval_seconds,
            "BackoffRate": self.backoff_rate,
            "MaxDelaySeconds": self.max_delay_seconds,
            "JitterStrategy": "FULL" if self.full_jitter else None,
        }
        return {
            "ErrorEquals": list(self.errors),
            "MaxAttempts": self.max_attempts,
            **{name: value for name, value in fields.items() if value is not None},
        }

    def longest_wait_seconds(self) -> float:
        """The most a task waits across all of this retrier's attempts (jitter only shortens a wait)."""
        interval, rate = self.interval_seconds or 1, self.backoff_rate or 2.0
        cap = self.max_delay_seconds
        return float(
            sum(min(interval * rate**i, cap or interval * rate**i) for i in range(self.max_attempts))
        )


@dataclass(frozen=True)
class RetryPolicy:
    """A task's whole Retry: its retriers, in the order Step Functions tries them."""

    name: str
    retriers: tuple[Retrier, ...]

    def asl(self) -> list[dict[str, Any]]:
        return [retrier.asl() for retrier in self.retriers]

    def matches(self, retry: list[dict[str, Any]] | None) -> bool:
        """Whether an ASL Retry is this policy (the errors of a retrier in any order)."""

        def comparable(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [{**entry, "ErrorEquals": sorted(entry["ErrorEquals"])} for entry in entries]

        return retry is not None and comparable(retry) == comparable(self.asl())


def _any_error(interval_seconds: int, max_attempts: int) -> Retrier:
    return Retrier(ANY_ERROR, max_attempts, interval_seconds, 2)


THROTTLED = Retrier(LAMBDA_THROTTLED, 20, 1, 2, max_delay_seconds=16, full_jitter=True)
"""Every Lambda task's first retrier: a throttled invocation did nothing, so it is tried again, for as long
as a burst takes to drain at a concurrency quota of 10 (new accounts: Lambda Developer Guide, "Lambda
quotas"): waits of up to 1, 2, 4, 8 and then 16 s, 271 s in all, each a random share of that (the Step
Functions guide's JitterStrategy), so a Map's throttled iterations spread out rather than collide again."""
IDEMPOTENT = RetryPolicy("idempotent", (THROTTLED, _any_error(1, 3)))
"""A step that finds its own earlier effect: whatever failed, tried again, three times in all after it."""
IDEMPOTENT_LAUNCH = RetryPolicy("idempotent launch", (THROTTLED, _any_error(2, 3)))
"""A launch: as IDEMPOTENT, with a longer first wait for EC2 (CreateFleet) to settle."""
LAST_RESORT = RetryPolicy("last resort", (THROTTLED, _any_error(2, 5)))
"""What cleans up after a failed execution: nothing follows it, so it is tried longest."""
REFUSE_OR_RETRY = RetryPolicy(
    "refuse, or retry",
    (
        THROTTLED,
        Retrier((LabelError.__name__, MalformedRequestError.__name__), 0),
        Retrier(LAMBDA_REFUSED, 3, 1, 2),
        Retrier(LAMBDA_TIMED_OUT, 3, 1, 2),
        _any_error(1, 3),
    ),
)
"""A request refused for its label or its shape fails at once (MaxAttempts 0); any other failure is tried
again, the request being idempotent (States.ALL last, as the Step Functions guide requires of it)."""
FOLLOW_UP = RetryPolicy(
    "follow-up",
    (THROTTLED, Retrier(LAMBDA_REFUSED, 5, 1, 2), Retrier(LAMBDA_TIMED_OUT, 3, 1, 2), _any_error(1, 5)),
)
"""A follow-up's step: idempotent, and tried five times, for the run's demand waits on it."""
RELEASE = RetryPolicy(
    "release",
    (
        THROTTLED,
        Retrier((*LAMBDA_REFUSED, "Lambda.AWSLambdaException", ServiceBusyError.__name__), 3, 1, 2),
        Retrier((*LAMBDA_TIMED_OUT, ServiceUnreachableError.__name__), 3, 2, 2),
    ),
)
"""A release's step: tried again when Lambda or AWS was busy, or an answer was lost (each step is
idempotent); any other failure is caught by the machine, which salvages what the release held."""
