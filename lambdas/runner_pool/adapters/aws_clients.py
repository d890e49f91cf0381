"""Every AWS client of the product, built here with the one retry policy: how often a call is tried.

botocore retries each call, and nothing else does: standard mode, ATTEMPTS tries in all
(https://boto3.amazonaws.com/v1/documentation/api/latest/guide/retries.html, "Standard retry mode").
`total_max_attempts` counts the first try too; the older `max_attempts` key counts only retries
(botocore PR #1972, "Add support for new retry modes"). It is set explicitly because standard mode's
default differs by service (DynamoDB's is 4 since the cross-SDK retry revision, aws-sdk-go-v2 PR #3400).
The house `Backoff` retries only whole operations a successful call left undone (see backoff.py).

A call botocore gave up on because AWS stayed busy (throttling, or a transient 5xx) raises
ServiceBusyError, and one whose every attempt failed to reach AWS or to get its answer (a connection
refused or timed out, a read timed out, a connection dropped) raises ServiceUnreachableError: the
product's own errors, which the caller's own retry takes from there: the agent's loop, Step Functions'
Retry (release.asl.json names them), SQS redelivering to the dispatcher. No caller, and no state
machine, names a botocore class for either. Any other refusal raises AwsRefusedError, naming the
operation and AWS's code; an adapter that expects a code asks `refusal` (or, for a conditional write,
`conditional_write`) instead of catching botocore's error itself.

Worst case, as botocore 1.44 computes a retry's delay (botocore/retries/standard.py,
ExponentialBackoff): the i-th retry (0-based) waits rand(0, 1) * min(base * 2**i, 20 s), base 1 s for
throttling; a response carrying `x-amz-retry-after` may raise a wait to at most 5 s more.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotocoreConnectionError

ATTEMPTS = 3
"""How many times one call is tried in all, a throttled one included: the figure, stated once."""

CONNECT_TIMEOUT_SECONDS = 2
READ_TIMEOUT_SECONDS = 10
"""A hung attempt ends within these (botocore's defaults are 60 s each), and counts as an attempt."""

THROTTLING_BASE_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 20.0
RETRY_AFTER_EXTRA_SECONDS = 5.0
"""botocore's ExponentialBackoff: throttling_base_scale, _MAX_BACKOFF, _RETRY_AFTER_MAX_ADDITIONAL."""


def throttled_wait_seconds(*, retry_after: bool = True) -> float:
    """The longest a throttled call waits between its attempts (its answers come on top)."""
    extra = RETRY_AFTER_EXTRA_SECONDS if retry_after else 0.0
    return float(
        sum(
            min(THROTTLING_BASE_SECONDS * 2**retry, MAX_BACKOFF_SECONDS) + extra
            for retry in range(ATTEMPTS - 1)
        )
    )


def hung_call_seconds() -> float:
    """The longest a call whose every attempt hangs can take: each attempt times out, then is retried
    after at most 50 ms * 2**i (botocore's non-throttling base scale). 36.15 s: longer than a 30 s
    function, whose own timeout then ends it and whose caller retries it (see test_retry_budget.py)."""
    waits = sum(0.05 * 2**retry for retry in range(ATTEMPTS - 1))
    return float(ATTEMPTS * (CONNECT_TIMEOUT_SECONDS + READ_TIMEOUT_SECONDS) + waits)


POOL_CONNECTIONS = 16
"""Connections a client keeps (botocore's max_pool_connections, 10 by default): as many as a step's
calls side by side (adapters/side_by_side.py), so none waits for a connection or opens one it drops."""

CLIENT_CONFIG = Config(
    retries={"mode": "standard", "total_max_attempts": ATTEMPTS},
    connect_timeout=CONNECT_TIMEOUT_SECONDS,
    read_timeout=READ_TIMEOUT_SECONDS,
    max_pool_connections=POOL_CONNECTIONS,
)

THROTTLING_CODES = frozenset(
    {
        # botocore's standard mode (ThrottledRetryableChecker) retries exactly these as throttling.
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "EC2ThrottledException",
    }
)
TRANSIENT_CODES = frozenset(
    {
        # ...and these as transient (TransientRetryableChecker), with the 5xx codes AWS names them by.
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "InternalServerError",
        "InternalFailure",
        "ServiceUnavailable",
    }
)
BUSY_STATUS_CODES = frozenset({429, 500, 502, 503, 504})
"""HTTP statuses standard mode retries whatever the error code (429 as throttling, 5xx as transient)."""


class ServiceBusyError(RuntimeError):
    """AWS stayed busy through every attempt botocore made; the caller's own retry is next."""


class ServiceUnreachableError(RuntimeError):
    """AWS was not reached, or its answer not received, in any attempt botocore made; the caller's own
    retry is next."""


class AwsRefusedError(ClientError):
    """AWS refused a call with a code its adapter does not expect (access denied, a missing resource, a bad
    request): the product's own error, raised once, here. It keeps botocore's shape (`response`,
    `operation_name`), so what reads a refusal's code (`error_code`, the agent's aws_errors) reads it as
    before."""


CONDITION_FAILED = "ConditionalCheckFailedException"
"""DynamoDB's answer to a write whose condition did not hold (Amazon DynamoDB API Reference, UpdateItem,
Errors); with ReturnValuesOnConditionCheckFailure ALL_OLD it carries the item as it was."""


@dataclass(frozen=True)
class Refusal:
    """A refusal the caller expected: AWS's code, its message, and the item a failed condition found
    (empty when there was none, or the write did not ask for it)."""

    code: str
    message: str
    error: ClientError = field(repr=False)
    """The refusal as botocore raised it: the cause to keep, or to raise should the caller judge it real."""
    item: Mapping[str, Any] = field(default_factory=dict)


T = TypeVar("T")


def refusal(exc: ClientError, expected: frozenset[str] | tuple[str, ...]) -> Refusal:
    """`exc` as a Refusal when its code is one of `expected`; any other is raised as AwsRefusedError."""
    code = error_code(exc)
    if code not in expected:
        if isinstance(exc, AwsRefusedError):
            raise exc
        raise _refused_as(type(exc))(exc.response, exc.operation_name) from exc
    message = str(exc.response.get("Error", {}).get("Message", ""))
    return Refusal(code, message, exc, exc.response.get("Item", {}))  # type: ignore[arg-type]


def attempt(call: Callable[[], T], expected: frozenset[str] | tuple[str, ...]) -> T | Refusal:
    """`call`'s answer, or the Refusal it met when AWS refused it with an `expected` code."""
    try:
        return call()
    except ClientError as exc:
        return refusal(exc, expected)


def conditional_write(write: Callable[[], T]) -> T | Refusal:
    """A conditional write's answer when it applied, else the Refusal of its condition, whose `item` is
    the item as it was (for a write that asked for ALL_OLD): one place tells a lost condition from any
    other refusal."""
    return attempt(write, (CONDITION_FAILED,))


TRANSPORT_ERRORS = (BotocoreConnectionError, HTTPClientError)
"""botocore's errors for a call that never got an answer: EndpointConnectionError, ConnectTimeoutError
(ConnectionError's), ReadTimeoutError, ConnectionClosedError (HTTPClientError's), and their kin."""


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def is_busy(code: str, status: int | None = None) -> bool:
    """Whether an AWS error is one standard mode retries: AWS was busy, not the request wrong."""
    return code in THROTTLING_CODES or code in TRANSIENT_CODES or status in BUSY_STATUS_CODES


def client(service: str, session: boto3.session.Session | None = None, **options: Any) -> Any:
    """A client of `service` with the product's retry policy; `options` as boto3's (endpoint, region...)."""
    factory: Any = session or boto3  # boto3.client: the default session, shared by the process's clients
    return with_busy_errors(factory.client(service, config=CLIENT_CONFIG, **options))


def long_poll_client(
    service: str,
    wait_seconds: float,
    session: boto3.session.Session | None = None,
    *,
    connections: int = 10,
    **options: Any,
) -> Any:
    """`client`, for calls that wait up to `wait_seconds` on the server (SQS long polls): its read timeout
    outlasts the wait, so a long poll is not cut short and retried as a hung call. `connections`:
    how many calls may wait at once (botocore's max_pool_connections, 10 by default)."""
    factory: Any = session or boto3
    config = CLIENT_CONFIG.merge(
        Config(read_timeout=wait_seconds + READ_TIMEOUT_SECONDS, max_pool_connections=connections)
    )
    return with_busy_errors(factory.client(service, config=config, **options))


def with_busy_errors(made: Any) -> Any:
    """`made` raises ServiceBusyError for a call AWS kept busy, ServiceUnreachableError for one that never
    got an answer, and AwsRefusedError for any other refusal (for clients the caller configured itself)."""
    made.meta.events.register(
        "after-call",
        functools.partial(_raise_the_products_error, made.exceptions),
        unique_id="runner-pool-busy",
    )
    made.meta.events.register(
        "after-call-error", _raise_when_unreachable, unique_id="runner-pool-unreachable"
    )
    return made


def _raise_the_products_error(
    exceptions: Any, http_response: Any, parsed: dict[str, Any], model: Any, **_: Any
) -> None:
    # after-call comes once per call, after botocore's last attempt: this is the answer the caller gets.
    status = getattr(http_response, "status_code", 200)
    if status < 300:
        return
    code = str(parsed.get("Error", {}).get("Code", ""))
    if is_busy(code, status):
        attempts = parsed.get("ResponseMetadata", {}).get("RetryAttempts", 0) + 1
        raise ServiceBusyError(f"{model.name}: AWS answered {code or status} to each of {attempts} attempts")
    raise _refused_as(exceptions.from_code(code))(parsed, model.name)  # type: ignore[arg-type]


_REFUSED_AS: dict[type[ClientError], type[AwsRefusedError]] = {ClientError: AwsRefusedError}


def _refused_as(modeled: type[ClientError]) -> type[AwsRefusedError]:
    """AwsRefusedError, and the class botocore would have raised for the code (its name kept, so a task's
    error in Step Functions is named as before)."""
    made = _REFUSED_AS.get(modeled)
    if made is None:
        made = type(modeled.__name__, (AwsRefusedError, modeled), {"__module__": modeled.__module__})
        made = _REFUSED_AS.setdefault(modeled, made)
    return made


def _raise_when_unreachable(exception: Exception, **_: Any) -> None:
    # after-call-error comes once per call that raised, after botocore's last attempt; raising here
    # replaces botocore's exception with ours (the cause kept), as the caller then receives it.
    if isinstance(exception, TRANSPORT_ERRORS):
        raise ServiceUnreachableError(str(exception)) from exception
